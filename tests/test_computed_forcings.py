"""Computed forcings equal earthkit-data's ``forcings`` source (golden values in tests/data/earthkit_forcings.npz,
written by tests/data/make_earthkit_forcings.py with earthkit-data 0.20; earthkit itself is not needed here)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from anemo_like.data.forcings import FORCINGS, computed_forcings

GOLDEN = Path(__file__).parent / "data" / "earthkit_forcings.npz"


def _golden() -> dict[str, np.ndarray]:
    with np.load(GOLDEN) as golden:
        return {key: golden[key] for key in golden.files}


def _ours(names: list[str], golden: dict[str, np.ndarray]) -> np.ndarray:
    dates = golden["dates"].astype("datetime64[s]")
    return computed_forcings(names, dates, golden["latitudes"], golden["longitudes"]).astype(np.float64)


def test_golden_file_covers_every_forcing_and_the_awkward_places() -> None:
    golden = _golden()
    assert sorted(golden["names"].tolist()) == sorted(FORCINGS)
    assert golden["values"].shape == (golden["dates"].size, golden["names"].size, golden["latitudes"].size)
    lat, lon = golden["latitudes"], golden["longitudes"]
    assert {90.0, -90.0} <= set(lat.tolist()) and {180.0, -180.0, 360.0} <= set(lon.tolist())
    assert (lon < 0).any() and (lon > 180).any()
    assert {"2000-02-29T06:30:00", "2000-12-31T18:00:00", "1999-06-21T12:00:00"} <= set(golden["dates"].tolist())


@pytest.mark.parametrize("name", sorted(FORCINGS))
def test_forcing_equals_earthkit(name: str) -> None:
    golden = _golden()
    expected = golden["values"][:, golden["names"].tolist().index(name)]  # (T, G)
    ours = _ours([name], golden)[:, 0]
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6, err_msg=name)


def test_all_forcings_at_once_keep_the_order_asked_for() -> None:
    golden = _golden()
    names = golden["names"].tolist()[::-1]
    ours = _ours(names, golden)
    expected = golden["values"][:, ::-1]
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6)
    assert computed_forcings(names, golden["dates"].astype("datetime64[s]"), [0.0], [0.0]).dtype == np.float32


def test_insolation_is_zero_at_night_and_the_cosine_of_the_zenith_angle_by_day() -> None:
    dates = np.array(["1999-06-21T12:00"], dtype="datetime64[s]")
    values = computed_forcings(["insolation"], dates, np.array([23.44, 0.0, 0.0]), np.array([0.0, 180.0, 90.0]))
    assert values[0, 0, 0] > 0.99  # the sun overhead near the tropic of Cancer at midsummer noon
    assert values[0, 0, 1] == 0.0 and values[0, 0, 2] < 0.05  # midnight; sunset


def test_unknown_names_are_refused_naming_them_and_the_available_ones() -> None:
    dates = np.array(["2000-01-01T00"], dtype="datetime64[s]")
    with pytest.raises(ValueError, match=r"unknown computed forcing\(s\) \['cos_julian_days', 'toa'\]") as error:
        computed_forcings(["cos_julian_day", "cos_julian_days", "toa"], dates, np.zeros(2), np.zeros(2))
    assert all(name in str(error.value) for name in FORCINGS)


def test_no_names_give_an_empty_variable_axis() -> None:
    dates = np.array(["2000-01-01T00", "2000-01-01T06"], dtype="datetime64[s]")
    assert computed_forcings([], dates, np.zeros(3), np.zeros(3)).shape == (2, 0, 3)

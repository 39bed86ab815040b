"""The generated regional dataset pair: a high-resolution box and the whole run coarsened to the built-in grid."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from anemo_like.data import builtin, quasi_geostrophic, regional_pair
from anemo_like.data.zarr_store import open_anemoi_zarr

N_LAT, N_DATES, SPIN_UP_DAYS = 64, 8, 0.5  # a 64 x 128 run: 1.4 x 2.8 degree cells


@pytest.fixture(scope="module")
def high_res() -> np.ndarray:
    """The run the pair is cut from: (dates, len(PROGNOSTIC), N_LAT, 2 N_LAT) float64."""
    values = quasi_geostrophic.simulate(seed=3, n_dates=N_DATES, n_lat=N_LAT, spin_up_days=SPIN_UP_DAYS)
    return values.astype(np.float64).reshape(N_DATES, -1, N_LAT, 2 * N_LAT)


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pair")
    return regional_pair.write_regional_pair(folder, seed=3, n_dates=N_DATES, n_lat=N_LAT, spin_up_days=SPIN_UP_DAYS)


def _prognostic(path: Path) -> np.ndarray:
    """Stored prognostic fields (dates, len(PROGNOSTIC), grid)."""
    store = open_anemoi_zarr(path)
    return store.read(slice(None), store.variable_indices(builtin.PROGNOSTIC)).astype(np.float64)


def _rounding(values: np.ndarray) -> np.ndarray:
    """Half a unit in the last of the 14 stored mantissa bits of each value."""
    return np.abs(values) * 2.0**-14


def test_the_region_holds_the_box_at_full_resolution_north_to_south_west_to_east(pair) -> None:
    store = open_anemoi_zarr(pair[0])
    spacing = 180.0 / N_LAT
    # rows 35..70 N: centres 68.91 .. 35.16 (13 rows); columns -20..40 E: centres -19.69 .. 39.38 (22 columns)
    rows = 68.90625 - np.arange(13) * spacing
    columns = -19.6875 + np.arange(22) * spacing
    assert store.shape == (N_DATES, len(builtin.VARIABLES), 1, 13 * 22)
    assert store.attrs["field_shape"] == [13, 22]
    np.testing.assert_allclose(store.latitudes, np.repeat(rows, 22))
    np.testing.assert_allclose(store.longitudes, np.tile(columns % 360, 13))
    assert store.latitudes.max() < 70 < store.latitudes.max() + spacing
    assert store.latitudes.min() - spacing < 35 < store.latitudes.min()


def test_the_global_store_is_on_the_builtin_grid(pair) -> None:
    store = open_anemoi_zarr(pair[1])
    lat, lon = builtin.grid()
    assert store.shape == (N_DATES, len(builtin.VARIABLES), 1, 32 * 64)
    np.testing.assert_array_equal(store.latitudes, lat)
    np.testing.assert_array_equal(store.longitudes, lon)


def test_both_stores_carry_the_builtin_variables_dates_and_attributes(pair) -> None:
    for path, name in zip(pair, (regional_pair.REGION_NAME, regional_pair.GLOBAL_NAME), strict=True):
        store = open_anemoi_zarr(path)
        assert store.variables == list(builtin.VARIABLES)
        assert store.dates[0] == builtin.START_DATE
        assert store.frequency.total_seconds() == 6 * 3600
        assert store.attrs["builtin"]["seed"] == 3
        assert name in store.attrs["description"]
        assert store.attrs["constant_fields"] == list(builtin.FORCINGS)
        assert store.attrs["variables_metadata"]["z_500"]["units"] == "m**2 s**-2"
        data = store.read(slice(0, 1), np.arange(len(builtin.VARIABLES)))[0]
        np.testing.assert_allclose(data[builtin.VARIABLES.index("cos_latitude")], np.cos(np.deg2rad(store.latitudes)))
        np.testing.assert_allclose(data[builtin.VARIABLES.index("sin_longitude")], np.sin(np.deg2rad(store.longitudes)))
        stored = data[len(builtin.FORCINGS) :]
        assert np.array_equal(stored, builtin.round_mantissa(stored, bits=14))


def test_region_values_are_the_runs_values_at_those_points(pair, high_res) -> None:
    lat = 90 - (np.arange(N_LAT) + 0.5) * 180 / N_LAT
    lon = np.arange(2 * N_LAT) * 180 / N_LAT
    store = open_anemoi_zarr(pair[0])
    # independent of the module: look each point up by its coordinates
    row = np.abs(lat[None] - store.latitudes[:, None]).argmin(axis=1)
    column = np.abs(lon[None] - store.longitudes[:, None]).argmin(axis=1)
    np.testing.assert_allclose(lat[row], store.latitudes)
    np.testing.assert_allclose(lon[column], store.longitudes)
    expected = high_res[:, :, row, column]
    np.testing.assert_allclose(_prognostic(pair[0]), expected, rtol=0, atol=_rounding(expected).max())


def test_global_values_are_area_weighted_means_of_the_runs_cells(pair, high_res) -> None:
    """Each coarse cell (5.625 degrees) is the cos-latitude weighted mean of the 2 fine rows inside it and, in longitude
    (points at 0, 5.625, ...: cells centred on them), of fine columns 2j-1, 2j, 2j+1 with weights 1/4, 1/2, 1/4."""
    lat = 90 - (np.arange(N_LAT) + 0.5) * 180 / N_LAT
    weights = np.cos(np.deg2rad(lat)).reshape(32, 2, 1)
    fine = high_res.reshape(N_DATES, -1, 32, 2, 2 * N_LAT)
    rows = (fine * weights).sum(axis=3) / weights.sum(axis=1)
    columns = 0.25 * np.roll(rows, 1, axis=-1) + 0.5 * rows + 0.25 * np.roll(rows, -1, axis=-1)
    expected = columns[..., ::2].reshape(N_DATES, -1, 32 * 64)
    np.testing.assert_allclose(_prognostic(pair[1]), expected, rtol=0, atol=2 * _rounding(expected).max())
    # not merely a fine point: the fine fields vary inside a coarse cell by far more than the rounding
    nearest = high_res[:, :, 1::2, ::2].reshape(N_DATES, -1, 32 * 64)
    assert (np.abs(nearest - expected).max(axis=(0, 2)) > 10 * _rounding(expected).max(axis=(0, 2))).all()


@pytest.mark.parametrize("n_lat", [32, 96, 128])
def test_coarsening_weights_average_each_coarse_cell(n_lat) -> None:
    rows, columns = regional_pair.coarsening_weights(n_lat)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0)
    np.testing.assert_allclose(columns.sum(axis=0), 1.0)
    lat, lon = regional_pair.high_resolution_grid(n_lat)
    coarse_lat, coarse_lon = builtin.grid()
    # rows: the fine rows inside each coarse row, weighted by cos(latitude)
    inside = np.abs(lat[None] - coarse_lat[::64, None]) < 90 / 32
    assert (inside.sum(axis=1) == n_lat // 32).all()
    np.testing.assert_array_equal(rows > 0, inside)
    area = np.cos(np.deg2rad(lat)) * inside
    np.testing.assert_allclose(rows, area / area.sum(axis=1, keepdims=True))
    # columns: the fine columns within half a coarse cell, centred on the coarse point (the date line wraps)
    distance = np.abs((lon[:, None] - coarse_lon[None, :64] + 180) % 360 - 180)
    assert (distance[columns > 0] <= 180 / 64 + 1e-9).all()
    east = np.exp(1j * np.deg2rad(lon)) @ columns
    np.testing.assert_allclose(east / np.abs(east), np.exp(1j * np.deg2rad(coarse_lon[:64])), atol=1e-12)


def test_a_resolution_that_does_not_nest_the_builtin_grid_is_refused() -> None:
    with pytest.raises(ValueError, match=r"n_lat must be a positive multiple of 32 .*got 48"):
        regional_pair.coarsening_weights(48)


def _digest(path: Path) -> str:
    """Hash of the names and bytes of every file of a store."""
    digest = hashlib.sha256()
    for file in sorted(path.rglob("*")):
        if file.is_file():
            digest.update(file.relative_to(path).as_posix().encode() + file.read_bytes())
    return digest.hexdigest()


def test_the_pair_is_reproducible_from_its_seed(tmp_path) -> None:
    def write(folder: str, seed: int) -> tuple[Path, Path]:
        return regional_pair.write_regional_pair(
            tmp_path / folder, seed=seed, n_dates=2, n_lat=N_LAT, spin_up_days=0.25
        )

    for first, second, different in zip(write("one", 3), write("again", 3), write("other", 4), strict=True):
        assert _digest(first) == _digest(second)
        assert not np.array_equal(_prognostic(first), _prognostic(different))


def _small_pairs(monkeypatch) -> None:
    """ensure_regional_pair makes 4 dates on the built-in grid itself after a quarter of a day."""
    monkeypatch.setattr(regional_pair, "N_DATES", 4)
    monkeypatch.setattr(regional_pair, "N_LAT", 32)
    monkeypatch.setattr(regional_pair, "SPIN_UP_DAYS", 0.25)


def test_ensure_generates_the_pair_once_and_reuses_it(tmp_path, monkeypatch) -> None:
    _small_pairs(monkeypatch)
    calls = []
    generate = regional_pair._generate
    monkeypatch.setattr(regional_pair, "_generate", lambda *a, **k: calls.append(k) or generate(*a, **k))
    paths = regional_pair.ensure_regional_pair(tmp_path / "cache", seed=5, progress=False)
    names = [path.name for path in paths]
    assert names == ["builtin-regional-v1-seed5-region.zarr", "builtin-regional-v1-seed5-global.zarr"]
    assert [open_anemoi_zarr(path).shape[0] for path in paths] == [4, 4]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == sorted(names)  # no scratch folder left
    modified = [path.stat().st_mtime_ns for path in paths]
    assert regional_pair.ensure_regional_pair(tmp_path / "cache", seed=5, progress=False) == paths
    assert len(calls) == 1
    assert [path.stat().st_mtime_ns for path in paths] == modified


def test_ensure_replaces_a_store_whose_twin_is_missing(tmp_path, monkeypatch) -> None:
    """A pair comes from one run: a lone store left behind is generated again with its twin."""
    _small_pairs(monkeypatch)
    region, coarse = regional_pair.ensure_regional_pair(tmp_path, seed=5, progress=False)
    kept, modified = _digest(region), region.stat().st_mtime_ns
    builtin.discard_store(coarse)
    assert regional_pair.ensure_regional_pair(tmp_path, seed=5, progress=False) == (region, coarse)
    assert region.stat().st_mtime_ns != modified
    assert _digest(region) == kept
    assert open_anemoi_zarr(coarse).shape == (4, len(builtin.VARIABLES), 1, 32 * 64)


def test_ensure_keeps_the_pair_of_a_process_that_finished_first(tmp_path, monkeypatch) -> None:
    _small_pairs(monkeypatch)
    cache = tmp_path / "cache"
    theirs = regional_pair.write_regional_pair(tmp_path / "theirs", seed=6, n_dates=4, n_lat=32, spin_up_days=0.25)
    generate = regional_pair._generate

    def race(folder: Path, **kwargs) -> tuple[Path, Path]:
        ours = generate(folder, **kwargs)
        for source, part in zip(theirs, ("region", "global"), strict=True):  # the other process renames its pair
            source.rename(cache / f"builtin-regional-v1-seed5-{part}.zarr")
        return ours

    monkeypatch.setattr(regional_pair, "_generate", race)
    paths = regional_pair.ensure_regional_pair(cache, seed=5, progress=False)
    assert [open_anemoi_zarr(path).attrs["builtin"]["seed"] for path in paths] == [6, 6]
    assert sorted(path.name for path in cache.iterdir()) == sorted(path.name for path in paths)


def test_simulating_in_chunks_gives_the_same_fields() -> None:
    """The pair is simulated a few dates at a time; the values do not depend on it."""
    whole = quasi_geostrophic.simulate(seed=1, n_dates=6, spin_up_days=0.5)
    chunks = list(quasi_geostrophic.simulate_in_chunks(seed=1, n_dates=6, chunk_dates=4, spin_up_days=0.5))
    assert [len(chunk) for chunk in chunks] == [4, 2]
    np.testing.assert_array_equal(np.concatenate(chunks), whole)


def test_a_grid_the_atmosphere_cannot_run_on_is_refused() -> None:
    with pytest.raises(ValueError, match="even number of latitudes >= 8, got n_lat=33"):
        quasi_geostrophic.simulate(seed=0, n_dates=1, n_lat=33)


def test_the_child_that_generates_the_pair_reports_its_progress(tmp_path) -> None:
    """Generating the pair takes minutes at its default size: the child process logs the spin-up and the dates it
    simulated (plain lines when stderr is not a terminal), not silence."""
    import subprocess
    import sys

    arguments = [str(tmp_path / "pair"), "3", "4", "64", "0.5", "1"]  # 4 dates on 64 x 128 after half a day's spin-up
    done = subprocess.run(
        [sys.executable, "-m", "anemo_like.data.regional_pair", *arguments], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "spin-up: " in done.stderr and "built-in dataset: 4/4 date" in done.stderr, done.stderr[-2000:]

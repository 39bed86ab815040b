"""A regional dataset inset into a global one (data.cutout): the min-distance rule, the combined grid and its
region mask, reads equal to the parts, statistics of the combined grid, pickling, every refusal, and a run's data
set up on it (training, and anemo-infer's truth and climatology)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from bad_input_helpers import TINY_DATA, VARIABLES
from inference_helpers import documented, infer_config
from regional_helpers import DATES, METADATA, box_grid, global_grid, write_store

from anemo_like.config import ConfigError
from anemo_like.data.cutout import CutoutZarr, cutout_keep, default_min_distance_km, open_cutout
from anemo_like.data.point_masks import BOUNDARY, REGION, point_mask
from anemo_like.data.setup import setup_data
from anemo_like.data.sphere import EARTH_RADIUS_KM
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.data.zarr_writer import compute_statistics, write_anemoi_zarr
from anemo_like.inference.inputs import open_truth
from anemo_like.inference.verification import training_climatology

KM_PER_DEGREE = np.pi * EARTH_RADIUS_KM / 180.0
ALL = np.arange(len(VARIABLES))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path]:
    """(regional box store, global 12 x 24 store)."""
    folder = tmp_path_factory.mktemp("cutout")
    return write_store(folder / "box.zarr", *box_grid(), seed=1), write_store(folder / "globe.zarr", *global_grid())


@pytest.fixture(scope="module")
def view(stores, tmp_path_factory) -> CutoutZarr:
    regional, globe = (open_anemoi_zarr(path) for path in stores)
    return open_cutout(regional, globe, min_distance_km=None, cache=tmp_path_factory.mktemp("cache"))


def test_min_distance_rule_on_a_hand_made_example() -> None:
    regional = np.array([0.0, 0.0, 1.0, 1.0]), np.array([0.0, 1.0, 0.0, 1.0])
    # (0.5, 0.5) inside; (0, 3) 2 degrees (222 km) from (0, 1); the others thousands of km away
    lat, lon = np.array([0.5, 0.0, 0.0, 45.0, -45.0, 0.0]), np.array([0.5, 3.0, 10.0, 0.0, 0.0, 180.0])
    assert cutout_keep(*regional, lat, lon, 300.0).tolist() == [False, False, True, True, True, True]
    assert cutout_keep(*regional, lat, lon, 200.0).tolist() == [False, True, True, True, True, True]
    assert cutout_keep(*regional, lat, lon, 2 * KM_PER_DEGREE - 1.0)[1]  # kept when farther, not when as far
    assert not cutout_keep(*regional, lat, lon, 2 * KM_PER_DEGREE + 1.0)[1]


def test_default_min_distance_is_the_regional_spacing() -> None:
    # the box's nearest neighbours are 2 degrees of longitude apart, times cos(latitude) <= 1
    spacing = default_min_distance_km(*box_grid())
    assert 0.98 * 2 * KM_PER_DEGREE < spacing <= 2 * KM_PER_DEGREE


def test_combined_grid_counts_and_region_mask(view, stores) -> None:
    box_lat, box_lon = box_grid()
    globe_lat, globe_lon = global_grid()
    inside = (np.abs(globe_lat) <= 10.0) & (globe_lon <= 20.0)  # (+-7.5, 0) and (+-7.5, 15)
    assert inside.sum() == 4
    assert view.kept.tolist() == np.flatnonzero(~inside).tolist()
    assert view.shape == (len(DATES), len(VARIABLES), 1, 121 + 284)
    np.testing.assert_array_equal(view.latitudes, np.concatenate([box_lat, globe_lat[~inside]]))
    np.testing.assert_array_equal(view.longitudes, np.concatenate([box_lon, globe_lon[~inside]]))
    assert point_mask(view, REGION).tolist() == [True] * 121 + [False] * 284
    assert point_mask(view, BOUNDARY) is None
    assert view.path == stores[0] and f"cutout of {stores[0]} into {stores[1]}" in repr(view)
    assert view.attrs["cutout"]["global_points_kept"] == 284
    assert view.attrs["variables_metadata"] == METADATA["variables_metadata"]


def test_reads_equal_the_parts(view, stores) -> None:
    regional, globe = (open_anemoi_zarr(path) for path in stores)
    variables = np.array([6, 0, 4])  # z_500, cos_latitude, sp: any order
    whole = view.read(slice(2, 5), variables)
    np.testing.assert_array_equal(whole[..., :121], regional.read(slice(2, 5), variables))
    np.testing.assert_array_equal(whole[..., 121:], globe.read(slice(2, 5), variables)[..., view.kept])
    for grid in (slice(0, 50), slice(130, 200), slice(100, 140), slice(3, 400, 7), slice(121, 121)):
        np.testing.assert_array_equal(view.read(slice(2, 5), variables, grid), whole[..., grid])
    assert view.read(slice(0, 1), ALL).dtype == np.float32


def test_statistics_of_the_combined_grid_and_their_cache(view, stores, tmp_path) -> None:
    whole = view.read(slice(None), ALL)[:, :, None, :]  # 20 dates: all of them are sampled
    for key, expected in compute_statistics(whole).items():
        np.testing.assert_allclose(view.statistics[key], expected, rtol=1e-6, atol=1e-9, err_msg=key)
    regional, globe = (open_anemoi_zarr(path) for path in stores)
    first = open_cutout(regional, globe, min_distance_km=None, cache=tmp_path)
    (cached,) = (tmp_path / "views").iterdir()
    cached.write_text(cached.read_text().replace("[", "[12345.0, ", 1))  # the next open reads the file
    again = open_cutout(regional, globe, min_distance_km=None, cache=tmp_path)
    assert again.statistics["mean"][0] == 12345.0 != first.statistics["mean"][0]


def test_pickles_for_loader_workers(view) -> None:
    view.read(slice(0, 1), ALL)  # opened handles are not pickled
    copy = pickle.loads(pickle.dumps(view))
    assert isinstance(copy, CutoutZarr)
    np.testing.assert_array_equal(copy.read(slice(0, 3), ALL), view.read(slice(0, 3), ALL))
    assert point_mask(copy, REGION).sum() == 121


def refusal(regional: Path, globe: Path, min_distance_km: float | None = None) -> str:
    """The setup message of this cut-out, with REGIONAL and GLOBAL for the paths; checked against its row of
    docs/errors.md."""
    with pytest.raises(ValueError) as info:
        open_cutout(open_anemoi_zarr(regional), open_anemoi_zarr(globe), min_distance_km=min_distance_km, cache=None)
    message = f"data.cutout: {info.value}"
    documented(message, REGIONAL=regional, GLOBAL=globe)
    return message.replace(str(regional), "REGIONAL").replace(str(globe), "GLOBAL")


def test_refusals(stores, tmp_path) -> None:
    box, globe = stores
    fewer = write_store(tmp_path / "fewer.zarr", *box_grid(), variables=[v for v in VARIABLES if v != "z_500"])
    assert refusal(fewer, globe) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: the variables differ (REGIONAL lacks z_500 compared with "
        "GLOBAL); both datasets need the same variables"
    )
    later = write_store(tmp_path / "later.zarr", *box_grid(), dates=DATES + np.timedelta64(6, "h"))
    assert refusal(later, globe) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: the dates differ (GLOBAL: 2000-01-01T00:00:00 .. "
        "2000-01-05T18:00:00, REGIONAL: 2000-01-01T06:00:00 .. 2000-01-06T00:00:00); date 0 is 2000-01-01T00:00:00 "
        "in GLOBAL and 2000-01-01T06:00:00 in REGIONAL; both datasets need the same dates"
    )
    twelve = DATES[0] + np.arange(len(DATES)) * np.timedelta64(12, "h")
    slow = write_store(tmp_path / "slow.zarr", *box_grid(), dates=twelve, frequency="12h")
    assert refusal(slow, globe) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: the frequencies differ (GLOBAL: 6h, REGIONAL: 12h); both "
        "datasets need the same dates"
    )
    lat, lon = global_grid()
    south = write_store(tmp_path / "south.zarr", lat[lat < -30], lon[lat < -30])
    assert refusal(box, south) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: 121 of the 121 points of REGIONAL lie outside GLOBAL, e.g. "
        "(10, 8) is 5332 km from its nearest global point (more than 2 x the global spacing, 1650 km); the global "
        "dataset must cover the region"
    )
    assert refusal(box, globe, 30000.0) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: no global point is farther than min_distance_km 30000 from the "
        "region, so nothing of the global dataset is left; lower min_distance_km or use a global dataset"
    )


def test_other_ensemble_members_are_refused(stores, tmp_path) -> None:
    box, globe = stores
    regional = open_anemoi_zarr(box)
    members = np.repeat(regional.read(slice(None), ALL)[:, :, None, :], 2, axis=2)
    pair = write_anemoi_zarr(
        tmp_path / "pair.zarr",
        data=members,
        variables=VARIABLES,
        dates=DATES,
        latitudes=regional.latitudes,
        longitudes=regional.longitudes,
        frequency="6h",
    )
    assert refusal(pair, globe) == (
        "data.cutout: cutout of REGIONAL into GLOBAL: GLOBAL has 1 ensemble member(s), REGIONAL 2; both datasets "
        "need the same members"
    )


def cutout_overrides(stores: tuple[Path, Path], *more: str) -> list[str]:
    box, globe = stores
    return [f"data.dataset={globe}", *TINY_DATA, f"data.cutout={{dataset:'{box}',min_distance_km:null}}", *more]


def test_setup_data_reads_the_combined_grid(stores, compose_run, tmp_path) -> None:
    data = setup_data(compose_run(tmp_path / "run", cutout_overrides(stores)))
    assert isinstance(data.store, CutoutZarr) and data.store.shape[-1] == 405
    sample = data.train[0]
    assert sample.shape[-2] == 405  # (states, grid, variables)
    i = VARIABLES.index("sp")
    offset = data.normalizer.offset[data.normalizer.names.index("sp")]
    assert offset == pytest.approx(data.store.statistics["mean"][i])


def test_setup_data_names_the_key_of_a_refusal(stores, compose_run, tmp_path) -> None:
    config = compose_run(tmp_path / "run", cutout_overrides(stores, "data.cutout.min_distance_km=30000"))
    with pytest.raises(ValueError, match=r"^data\.cutout: cutout of .* no global point is farther"):
        setup_data(config)


def test_cutout_and_boundary_together_are_refused(stores, compose_run, tmp_path) -> None:
    globe = stores[1]
    both = cutout_overrides(stores, f"data.boundary={{dataset:'{globe}',width_rows:2}}")
    with pytest.raises(ConfigError) as info:
        compose_run(tmp_path / "run", both)
    line = (
        "config section 'data': cutout (a regional dataset inset into a global one) and boundary (a regional dataset "
        "forced at its edge) are two regional modes; set one of them to null"
    )
    assert line in str(info.value)
    documented(line)


def test_inference_opens_the_training_view(stores, compose_run, tmp_path) -> None:
    run = compose_run(tmp_path / "run", cutout_overrides(stores))
    arguments = f"output={tmp_path / 'forecast.nc'}", "dates=['2000-01-04T00']"
    truth = open_truth(infer_config(tmp_path / "inference.pt", *arguments), run)
    assert isinstance(truth, CutoutZarr) and truth.shape[-1] == 405
    given = open_truth(infer_config(tmp_path / "inference.pt", *arguments, f"dataset={stores[1]}"), run)
    assert not isinstance(given, CutoutZarr) and given.shape[-1] == 288  # a dataset given is read as it is
    assert training_climatology(run, ["sp", "z_500"], max_dates=3).shape == (405, 2)

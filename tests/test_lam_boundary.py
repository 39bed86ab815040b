"""The limited-area dataset (data.boundary) and the interpolation on the sphere it uses: exactness on linear
fields, the boundary strip of a regular box, forced values equal to the interpolated global ones, pickling, every
refusal, and a run's data set up on it."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
from bad_input_helpers import TINY_DATA, VARIABLES
from inference_helpers import documented
from regional_helpers import BOX_ROWS, DATES, box_grid, global_grid, write_store

from anemo_like.config import ConfigError
from anemo_like.data import interpolation
from anemo_like.data.boundary import BoundaryZarr, edge_distance_km, open_boundary
from anemo_like.data.interpolation import spherical_interpolator
from anemo_like.data.point_masks import BOUNDARY, REGION, point_mask
from anemo_like.data.setup import setup_data
from anemo_like.data.sphere import spacing_km, unit_vectors
from anemo_like.data.zarr_store import open_anemoi_zarr

ALL = np.arange(len(VARIABLES))


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> tuple[Path, Path]:
    """(regional box store, global 12 x 24 store)."""
    folder = tmp_path_factory.mktemp("lam")
    return write_store(folder / "box.zarr", *box_grid(), seed=1), write_store(folder / "globe.zarr", *global_grid())


def open_view(stores, **width) -> BoundaryZarr:
    return open_boundary(
        *(open_anemoi_zarr(path) for path in stores), **{"width_km": None, "width_rows": None, **width}
    )


def outer_rows(rows: int) -> np.ndarray:
    """(121,) bool: the outer ``rows`` rows and columns of the box."""
    i, j = np.meshgrid(np.arange(BOX_ROWS), np.arange(BOX_ROWS), indexing="ij")
    return (np.minimum(np.minimum(i, j), np.minimum(BOX_ROWS - 1 - i, BOX_ROWS - 1 - j)) < rows).ravel()


def test_interpolation_is_exact_on_linear_fields() -> None:
    source = global_grid()
    rng = np.random.default_rng(0)
    targets = rng.uniform(-90, 90, 500), rng.uniform(-180, 180, 500)
    interpolator = spherical_interpolator(*source, *targets)
    assert interpolator.indices.shape == interpolator.weights.shape == (500, 3)
    assert (interpolator.weights >= -1e-9).all()
    np.testing.assert_allclose(interpolator.weights.sum(axis=1), 1.0, atol=1e-12)
    slope = np.array([1.0, -2.0, 0.5])
    points = unit_vectors(*source)
    values = points @ slope + 3.0
    # a linear function of xyz is reproduced where each target's ray meets its triangle
    meets = np.einsum("tk,tkj->tj", interpolator.weights, points[interpolator.indices])
    np.testing.assert_allclose(interpolator.apply(values), meets @ slope + 3.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(meets / np.linalg.norm(meets, axis=1, keepdims=True), unit_vectors(*targets), atol=1e-12)
    assert np.abs(interpolator.apply(values) - (unit_vectors(*targets) @ slope + 3.0)).max() < 0.1  # the chord error
    stacked = np.stack([values, 2 * values])  # (..., S) -> (..., T)
    np.testing.assert_array_equal(interpolator.apply(stacked)[1], interpolator.apply(2 * values))
    at_sources = spherical_interpolator(*source, *source)
    np.testing.assert_array_equal(at_sources.apply(values), values)  # exact at the source points


def test_targets_no_candidate_contains_are_found_among_every_triangle(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    targets = rng.uniform(-90, 90, 300), rng.uniform(-180, 180, 300)
    usual = spherical_interpolator(*global_grid(), *targets)
    monkeypatch.setattr(interpolation, "CANDIDATE_NEIGHBOURS", 1)  # most targets miss their few candidates
    fallback = spherical_interpolator(*global_grid(), *targets)
    values = rng.normal(size=288)
    np.testing.assert_allclose(fallback.apply(values), usual.apply(values), rtol=0, atol=1e-12)


def test_interpolation_refuses_a_target_outside_the_sources() -> None:
    with pytest.raises(
        ValueError, match=r"^cannot interpolate to 1 target point\(s\), e\.g\. \(-60, 100\): no triangle"
    ):
        spherical_interpolator(*box_grid(), np.array([-60.0, 0.0]), np.array([100.0, 10.0]))


@pytest.mark.parametrize("rows", [1, 2, 3])
def test_width_rows_give_the_outer_rows(stores, rows) -> None:
    view = open_view(stores, width_rows=rows)
    assert point_mask(view, BOUNDARY).tolist() == outer_rows(rows).tolist()
    assert point_mask(view, REGION) is None


def test_width_km_and_the_edge_distance() -> None:
    spacing = spacing_km(unit_vectors(*box_grid()))
    distance = edge_distance_km(*box_grid()) / spacing  # row k (from 1) at k - 0.5 spacings, a little more
    for rows in range(1, 6):
        ring = outer_rows(rows) & ~outer_rows(rows - 1)
        assert (distance[ring] >= rows - 0.5 - 0.05).all() and (distance[ring] <= rows - 0.5 + 0.3).all(), rows


def test_width_km_selects_the_points_near_the_edge(stores) -> None:
    spacing = spacing_km(unit_vectors(*box_grid()))
    assert point_mask(open_view(stores, width_km=1.0 * spacing), BOUNDARY).tolist() == outer_rows(1).tolist()
    assert point_mask(open_view(stores, width_km=2.2 * spacing), BOUNDARY).tolist() == outer_rows(2).tolist()


def test_forced_values_are_the_interpolated_global_ones(stores) -> None:
    view = open_view(stores, width_rows=2)
    regional, globe = (open_anemoi_zarr(path) for path in stores)
    mask = outer_rows(2)
    lat, lon = box_grid()
    expected = spherical_interpolator(globe.latitudes, globe.longitudes, lat[mask], lon[mask])
    variables = np.array([5, 1, 6])
    values = view.read(slice(3, 7), variables)
    assert values.dtype == np.float32 and values.shape == (4, 3, 121)
    np.testing.assert_array_equal(
        values[..., mask], expected.apply(globe.read(slice(3, 7), variables)).astype(np.float32)
    )
    np.testing.assert_array_equal(values[..., ~mask], regional.read(slice(3, 7), variables)[..., ~mask])
    assert not np.allclose(values[..., mask], regional.read(slice(3, 7), variables)[..., mask])
    for grid in (slice(0, 30), slice(30, 50), slice(2, 121, 9)):
        np.testing.assert_array_equal(view.read(slice(3, 7), variables, grid), values[..., grid])
    for key, values in regional.statistics.items():  # the regional dataset's
        np.testing.assert_array_equal(view.statistics[key], values)


def test_pickles_for_loader_workers(stores) -> None:
    view = open_view(stores, width_rows=1)
    view.read(slice(0, 1), ALL)
    copy = pickle.loads(pickle.dumps(view))
    np.testing.assert_array_equal(copy.read(slice(0, 4), ALL), view.read(slice(0, 4), ALL))
    assert point_mask(copy, BOUNDARY).tolist() == outer_rows(1).tolist()


def refusal(regional: Path, globe: Path, **width) -> str:
    """The setup message of this boundary, with REGIONAL and GLOBAL for the paths; checked against its row of
    docs/errors.md."""
    with pytest.raises(ValueError) as info:
        open_view((regional, globe), **width)
    message = f"data.boundary: {info.value}"
    documented(message, REGIONAL=regional, GLOBAL=globe)
    return message.replace(str(regional), "REGIONAL").replace(str(globe), "GLOBAL")


def test_refusals_of_the_width(stores) -> None:
    assert refusal(*stores, width_rows=6) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: a boundary 1327 km wide leaves no interior point (every "
        "point of REGIONAL is within 1227 km of the region's edge); choose width_km below 1227 or width_rows below "
        "5.55 (the regional spacing is 221 km)"
    )
    assert point_mask(open_view(stores, width_km=1227.0), BOUNDARY).sum() == 120  # the widest leaves one point
    assert refusal(*stores, width_km=50.0) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: a boundary 50 km wide holds no point (the outermost points "
        "are 112 km from the region's edge); choose width_km of at least 113 or width_rows of at least 1"
    )


def test_a_global_dataset_has_no_boundary(stores, tmp_path) -> None:
    everywhere = write_store(tmp_path / "everywhere.zarr", *global_grid(), seed=2)
    assert refusal(everywhere, stores[1], width_rows=1) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: REGIONAL covers the whole globe, so it has no edge to force"
    )


def test_refusals_of_the_source(stores, tmp_path) -> None:
    box = stores[0]
    fewer = write_store(tmp_path / "fewer.zarr", *global_grid(), variables=[v for v in VARIABLES if v != "t_850"])
    assert refusal(box, fewer, width_rows=1) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: the variables differ (GLOBAL lacks t_850 compared with "
        "REGIONAL); both datasets need the same variables"
    )
    shorter = write_store(tmp_path / "shorter.zarr", *global_grid(), dates=DATES[:-2])
    assert refusal(box, shorter, width_rows=1) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: the dates differ (REGIONAL: 2000-01-01T00:00:00 .. "
        "2000-01-05T18:00:00, GLOBAL: 2000-01-01T00:00:00 .. 2000-01-05T06:00:00); date 18 is 2000-01-05T12:00:00 "
        "in REGIONAL and no date (it ends before) in GLOBAL; both datasets need the same dates"
    )
    lat, lon = global_grid()
    south = write_store(tmp_path / "south.zarr", lat[lat < -30], lon[lat < -30])
    assert refusal(box, south, width_rows=1) == (
        "data.boundary: boundary of REGIONAL from GLOBAL: 121 of the 121 points of REGIONAL lie outside GLOBAL, e.g. "
        "(10, 8) is 5332 km from its nearest global point (more than 2 x the global spacing, 1650 km); the global "
        "dataset must cover the region"
    )


def boundary_overrides(stores: tuple[Path, Path], width: str, *more: str) -> list[str]:
    box, globe = stores
    return [f"data.dataset={box}", *TINY_DATA, f"data.boundary={{dataset:'{globe}',{width}}}", *more]


def test_setup_data_reads_the_forced_grid(stores, compose_run, tmp_path) -> None:
    data = setup_data(compose_run(tmp_path / "run", boundary_overrides(stores, "width_rows:1")))
    assert isinstance(data.store, BoundaryZarr) and point_mask(data.store, BOUNDARY).sum() == 40
    regional = open_anemoi_zarr(stores[0])
    offset = data.normalizer.offset[data.normalizer.names.index("sp")]
    assert offset == regional.statistics["mean"][VARIABLES.index("sp")]  # the regional dataset's statistics
    assert data.train[0].shape[-2] == 121


def test_setup_data_names_the_key_of_a_refusal(stores, compose_run, tmp_path) -> None:
    config = compose_run(tmp_path / "run", boundary_overrides(stores, "width_rows:6"))
    with pytest.raises(ValueError, match=r"^data\.boundary: boundary of .* leaves no interior point"):
        setup_data(config)


@pytest.mark.parametrize(
    ("width", "given"),
    [
        ("width_rows:2,width_km:100", "both (width_km=100.0, width_rows=2)"),
        ("width_km:null", "neither (width_km=None, width_rows=None)"),
    ],
)
def test_exactly_one_width(stores, compose_run, tmp_path, width, given) -> None:
    with pytest.raises(ConfigError) as info:
        compose_run(tmp_path / "run", boundary_overrides(stores, width))
    line = f"config section 'data.boundary': set exactly one of width_km and width_rows, got {given}"
    assert line in str(info.value)
    if "both" in given:
        documented(line)

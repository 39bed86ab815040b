"""Stretched and limited-area hidden meshes (graph.hidden): node density against the configured resolutions, edges
reaching every data point, a connected processor graph, the cache key, bounded area weights of a regional grid, and
the config's refusals."""

from __future__ import annotations

import logging

import bad_input_helpers
import numpy as np
import pytest
from bad_input_helpers import config_error, message_of
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from anemo_like.config.model_schema import GraphConfig, LimitedAreaHidden, StretchedHidden
from anemo_like.data.point_masks import REGION, write_point_mask
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.graphs import build_graph, graph_fingerprint, load_or_build_graph
from anemo_like.graphs.areas import area_weights, outside_points, regional_area_weights
from anemo_like.graphs.builder import DECODER, ENCODER, PROCESSOR
from anemo_like.graphs.cache import graph_cache_key
from anemo_like.graphs.icosahedron import refined_icosahedron, triangle_edges
from anemo_like.graphs.ordering import hilbert_index
from anemo_like.graphs.stretched import regional_mesh
from anemo_like.sphere import EARTH_RADIUS_KM, great_circle_distance, latlon_to_xyz
from anemo_like.training.setup import build_run

GLOBAL, REGION_LEVEL, MARGIN_KM, KNN = 2, 4, 300.0, 3
STRETCHED = StretchedHidden(
    kind="stretched", global_resolution=GLOBAL, region_resolution=REGION_LEVEL, margin_km=MARGIN_KM
)
LIMITED = LimitedAreaHidden(kind="limited_area", region_resolution=REGION_LEVEL, margin_km=MARGIN_KM)
dataset, tiny_run = bad_input_helpers.dataset, bad_input_helpers.tiny_run  # the shared fixtures
BOX = (35.0, 70.0, -20.0, 40.0)  # latitudes and longitudes (degrees) of the regional box


def lat_lon_grid(latitudes: np.ndarray, longitudes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lat, lon = np.meshgrid(latitudes, longitudes, indexing="ij")
    return lat.ravel(), lon.ravel()


def box_grid(step: float) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centred points of step degrees filling BOX."""
    south, north, west, east = BOX
    return lat_lon_grid(np.arange(south + step / 2, north, step), np.arange(west + step / 2, east, step))


def combined_grid(num_lat: int = 32, num_lon: int = 64, step: float = 2.5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A cell-centred num_lat x num_lon global grid whose points in BOX are replaced by a denser box: latitudes,
    longitudes (degrees) and the region mask."""
    lat, lon = lat_lon_grid(-90 + (np.arange(num_lat) + 0.5) * 180 / num_lat, np.arange(num_lon) * 360 / num_lon)
    east_lon = (lon + 180) % 360 - 180
    south, north, west, east = BOX
    outside = ~((lat > south) & (lat < north) & (east_lon > west) & (east_lon < east))
    region_lat, region_lon = box_grid(step)
    region = np.r_[np.ones(len(region_lat), bool), np.zeros(outside.sum(), bool)]
    return np.r_[region_lat, lat[outside]], np.r_[region_lon, lon[outside]], region


def hidden_xyz(graph) -> np.ndarray:
    latlon = graph["hidden"].x.double().numpy()
    return latlon_to_xyz(latlon[:, 0], latlon[:, 1])


def data_xyz(graph) -> np.ndarray:
    latlon = graph["data"].x.double().numpy()
    return latlon_to_xyz(latlon[:, 0], latlon[:, 1])


def mean_edge_length(level: int) -> float:
    """Mean great-circle length (radians) of the triangle edges of refinement level ``level``."""
    mesh = refined_icosahedron(resolution=level)
    edges = triangle_edges(mesh.faces_per_level[level], len(mesh.vertices))[0]
    return float(great_circle_distance(mesh.vertices[edges[:, 0]], mesh.vertices[edges[:, 1]]).mean())


def nearest_distance(points: np.ndarray, to: np.ndarray) -> np.ndarray:
    """Great-circle distance (radians) from each of points (N, 3) to the nearest of to (M, 3)."""
    _, nearest = cKDTree(to).query(points)
    return great_circle_distance(points, to[nearest])


@pytest.fixture(scope="module")
def grid() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return combined_grid()


@pytest.fixture(scope="module")
def stretched(grid):
    latitudes, longitudes, region = grid
    return build_graph(latitudes, longitudes, hidden=STRETCHED, region=region, knn=KNN)


@pytest.fixture(scope="module")
def limited():
    return build_graph(*box_grid(2.5), hidden=LIMITED, knn=KNN)


def test_mesh_density_inside_and_outside_follows_the_resolutions(grid, stretched):
    region_xyz = latlon_to_xyz(*np.deg2rad(grid[:2])[:, grid[2]])
    nodes = hidden_xyz(stretched)
    spacing = great_circle_distance(nodes, nodes[cKDTree(nodes).query(nodes, k=2)[1][:, 1]])
    from_region = nearest_distance(nodes, region_xyz)
    fine, coarse = mean_edge_length(REGION_LEVEL), mean_edge_length(GLOBAL)
    inside = from_region <= MARGIN_KM / EARTH_RADIUS_KM
    outside = from_region > MARGIN_KM / EARTH_RADIUS_KM + 2 * coarse
    assert inside.sum() > 30 and outside.sum() > 100
    assert spacing[inside].mean() == pytest.approx(fine, rel=0.2)
    assert spacing[outside].mean() == pytest.approx(coarse, rel=0.2)
    # every vertex of the global level is a hidden node, and fine ones are only near the region
    global_level = refined_icosahedron(resolution=GLOBAL).vertices
    assert nearest_distance(global_level, nodes).max() < 1e-6
    assert stretched["hidden"].num_nodes < len(refined_icosahedron(resolution=REGION_LEVEL).vertices) / 4
    assert (stretched.global_resolution, stretched.region_resolution, stretched.mesh_resolution) == (2, 4, 4)


def test_hidden_nodes_follow_the_hilbert_curve(grid, stretched):
    latitudes, longitudes, region = grid
    mesh = regional_mesh(latlon_to_xyz(np.deg2rad(latitudes), np.deg2rad(longitudes)), region, STRETCHED)
    assert np.all(np.diff(hilbert_index(mesh.xyz)) >= 0)
    assert np.allclose(hidden_xyz(stretched), mesh.xyz, atol=1e-6)


@pytest.mark.parametrize("name", ["stretched", "limited"])
def test_every_data_point_has_encoder_and_decoder_edges(name, request):
    graph = request.getfixturevalue(name)
    num_data = graph["data"].num_nodes
    assert set(graph[ENCODER].edge_index[0].tolist()) == set(range(num_data))
    assert np.array_equal(np.bincount(graph[DECODER].edge_index[1].numpy(), minlength=num_data), np.full(num_data, KNN))


def test_encoder_radius_follows_the_local_spacing(grid, stretched):
    """The encoder edges of regional points are as short as the fine mesh, those of the rest as the coarse one."""
    data, nodes = data_xyz(stretched), hidden_xyz(stretched)
    sources, destinations = stretched[ENCODER].edge_index.numpy()
    lengths = great_circle_distance(data[sources], nodes[destinations])
    region = grid[2][sources]
    assert lengths[region].max() < 0.6 * mean_edge_length(REGION_LEVEL) * 1.3
    assert lengths[~region].mean() > 2 * lengths[region].mean()


@pytest.mark.parametrize("name", ["stretched", "limited"])
def test_processor_graph_is_connected_and_symmetric(name, request):
    graph = request.getfixturevalue(name)
    num_hidden = graph["hidden"].num_nodes
    sources, destinations = graph[PROCESSOR].edge_index.numpy()
    assert np.bincount(destinations, minlength=num_hidden).min() >= 1
    assert set(map(tuple, np.stack([sources, destinations]).T.tolist())) == set(
        map(tuple, np.stack([destinations, sources]).T.tolist())
    )
    adjacency = coo_matrix((np.ones(len(sources)), (sources, destinations)), shape=(num_hidden, num_hidden))
    assert connected_components(adjacency, directed=False)[0] == 1


def test_limited_area_nodes_lie_within_the_margin_of_the_data(limited):
    nodes, data = hidden_xyz(limited), data_xyz(limited)
    grid_spacing = np.deg2rad(2.5)
    assert nearest_distance(nodes, data).max() <= MARGIN_KM / EARTH_RADIUS_KM + grid_spacing
    assert 20 < limited["hidden"].num_nodes < len(refined_icosahedron(resolution=REGION_LEVEL).vertices) / 10
    assert limited.region_resolution == REGION_LEVEL and "global_resolution" not in limited


def test_limited_area_weights_are_bounded_cells():
    """Each cell of a regional lat/lon grid, its edge points' too, is close to its true area (cos(latitude))."""
    latitudes, longitudes = box_grid(2.5)
    xyz = latlon_to_xyz(np.deg2rad(latitudes), np.deg2rad(longitudes))
    expected = np.cos(np.deg2rad(latitudes)) / np.cos(np.deg2rad(latitudes)).mean()
    weights = regional_area_weights(xyz)
    assert weights.mean() == pytest.approx(1.0, rel=1e-5)
    assert np.abs(weights / expected - 1).max() < 0.05
    assert area_weights(xyz).max() > 20 * weights.max()  # unbounded: the edge cells cover the rest of the sphere
    graph = build_graph(latitudes, longitudes, hidden=LIMITED)
    assert np.allclose(graph["data"].area_weight.numpy(), weights)


@pytest.mark.parametrize("step", [1.0, 0.01])
def test_small_limited_area_grids_have_equal_cells(step):
    """A 10 x 10 grid of step degrees (down to 0.1 degrees across, nearly flat) gets cos(latitude) weights."""
    latitudes, longitudes = lat_lon_grid(60 + np.arange(10) * step, 5 + np.arange(10) * step)
    weights = regional_area_weights(latlon_to_xyz(np.deg2rad(latitudes), np.deg2rad(longitudes)))
    expected = np.cos(np.deg2rad(latitudes)) / np.cos(np.deg2rad(latitudes)).mean()
    assert np.abs(weights / expected - 1).max() < 0.02


def test_global_grid_area_weights_unchanged_by_the_bound():
    """Inside a (locally regular) grid no point outside it is found: a global one keeps its plain weights."""
    xyz = refined_icosahedron(resolution=3).vertices
    assert len(outside_points(xyz)) == 0
    assert np.array_equal(regional_area_weights(xyz), area_weights(xyz))


def test_cache_round_trip_and_keys(tmp_path, grid, stretched):
    latitudes, longitudes, region = grid
    arguments = {"mesh_resolution": 4, "cutoff_factor": 0.6, "knn": KNN, "processor_edges": True}
    built = load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, hidden=STRETCHED, region=region, **arguments)
    loaded = load_or_build_graph(
        latitudes, longitudes, cache_dir=tmp_path, hidden=STRETCHED, region=region, **arguments
    )
    assert len(list(tmp_path.glob("graph-*.pt"))) == 1
    assert graph_fingerprint(loaded) == graph_fingerprint(built) == graph_fingerprint(stretched)
    key = graph_cache_key(latitudes, longitudes, hidden=STRETCHED, region=region, **arguments)
    other_region = region.copy()
    other_region[0] = False
    assert graph_cache_key(latitudes, longitudes, hidden=STRETCHED, region=other_region, **arguments) != key
    assert graph_cache_key(latitudes, longitudes, hidden=LIMITED, **arguments) != key
    # a regional mesh ignores mesh_resolution; an icosahedral graph keeps the key it had before regional meshes
    assert (
        graph_cache_key(latitudes, longitudes, hidden=STRETCHED, region=region, **{**arguments, "mesh_resolution": 2})
        == key
    )
    square = np.linspace(-80, 80, 50), np.linspace(0, 350, 50)
    assert (
        graph_cache_key(*square, mesh_resolution=3, cutoff_factor=0.6, knn=3, processor_edges=True)
        == "e77db1a79db92187"
    )


def test_config_refusals():
    assert config_error("graph.hidden={kind:stretched,global_resolution:3,region_resolution:3,margin_km:100}") == (
        "invalid configuration:\n  config section 'graph.hidden': region_resolution (3) must be greater than "
        "global_resolution (3): the region's mesh is the finer one"
    )
    assert config_error("graph.hidden={kind:limited_area,region_resolution:4,margin_km:-1}") == (
        "invalid configuration:\n  config key 'graph.hidden.margin_km' = -1: expected at least 0"
    )
    assert config_error("graph.hidden={kind:limited_area,region_resolution:4,margin_km:0,global_resolution:2}") == (
        "invalid configuration:\n  unknown config key 'graph.hidden.global_resolution' (did you mean "
        "'graph.hidden.region_resolution'?); allowed here: kind, region_resolution, margin_km"
    )
    with pytest.raises(
        ValueError, match=r"knn \(13\) is more than the 12 hidden .* raise graph.hidden.global_resolution"
    ):
        GraphConfig(
            knn=13, hidden={"kind": "stretched", "global_resolution": 0, "region_resolution": 2, "margin_km": 0}
        )


def test_stretched_without_a_region_is_refused(grid):
    latitudes, longitudes, region = grid
    expected = "graph.hidden kind stretched needs the dataset's region mask"
    for mask in (None, np.zeros_like(region)):
        with pytest.raises(ValueError, match=expected):
            build_graph(latitudes, longitudes, hidden=STRETCHED, region=mask)
    with pytest.raises(ValueError, match=r"more than the \d+ hidden nodes of the limited_area mesh"):
        build_graph(*box_grid(2.5), hidden=LIMITED, knn=500)
    with pytest.raises(ValueError, match="limited_area: 0 mesh nodes of region_resolution 2 lie within margin_km 0 "):
        build_graph(
            [50.0, 50.5], [10.0, 10.5], hidden=LIMITED.model_copy(update={"region_resolution": 2, "margin_km": 0})
        )


def test_unconnected_data_points_are_logged(grid, caplog):
    latitudes, longitudes, region = grid
    with caplog.at_level(logging.INFO, logger="anemo_like.graphs.builder"):
        graph = build_graph(latitudes, longitudes, hidden=STRETCHED, region=region, cutoff_factor=0.1)
    assert "are outside every hidden node's encoder radius" in caplog.text
    assert set(graph[ENCODER].edge_index[0].tolist()) == set(range(len(latitudes)))


def small_store(path, latitudes: np.ndarray, longitudes: np.ndarray):
    """A 20-date anemoi dataset of bad_input_helpers.VARIABLES on the given points."""
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(20) * np.timedelta64(6, "h")
    data = np.random.default_rng(0).normal(size=(20, len(bad_input_helpers.VARIABLES), 1, len(latitudes)))
    return write_anemoi_zarr(
        path,
        data=data,
        variables=bad_input_helpers.VARIABLES,
        dates=dates,
        latitudes=latitudes,
        longitudes=longitudes,
        frequency="6h",
    )


def test_training_setup_passes_the_hidden_mesh_and_region_mask(tmp_path, tiny_run):
    """A run on a combined grid with a region mask builds the stretched mesh, without the mask it is refused; a run
    on a regional grid builds the limited-area mesh and trains with its bounded area weights."""
    latitudes, longitudes, region = combined_grid(8, 16, step=7.5)
    plain = small_store(tmp_path / "plain.zarr", latitudes, longitudes)
    combined = small_store(tmp_path / "combined.zarr", latitudes, longitudes)
    write_point_mask(combined, REGION, region)
    hidden = "graph.hidden={kind:stretched,global_resolution:1,region_resolution:3,margin_km:0}"
    run = build_run(tiny_run(hidden, "graph.knn=2", dataset=combined))
    assert run.graph.global_resolution == 1 and run.graph["hidden"].num_nodes > 42
    message = message_of(lambda: build_run(tiny_run(hidden, dataset=plain)))
    assert message.startswith("graph.hidden kind stretched needs the dataset's region mask")

    regional = small_store(tmp_path / "regional.zarr", *box_grid(5.0))
    limited = "graph.hidden={kind:limited_area,region_resolution:3,margin_km:500}"
    run = build_run(tiny_run(limited, dataset=regional))
    assert run.graph.region_resolution == 3 and "global_resolution" not in run.graph
    assert run.graph["data"].area_weight.max() < 1.5

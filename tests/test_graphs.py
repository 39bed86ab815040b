"""Tests for anemo_like.graphs, checked against brute-force computations on small point sets."""

import itertools
import logging

import numpy as np
import pytest
import torch
from scipy.spatial import SphericalVoronoi

from anemo_like.graphs import (
    build_graph,
    graph_fingerprint,
    graph_from_tensors,
    graph_to_tensors,
    load_or_build_graph,
)
from anemo_like.graphs import cache as graph_cache
from anemo_like.graphs.builder import DECODER, ENCODER, PROCESSOR
from anemo_like.graphs.edge_attributes import edge_directions
from anemo_like.graphs.icosahedron import refined_icosahedron
from anemo_like.graphs.ordering import hilbert_index, hilbert_order
from anemo_like.sphere import latlon_to_xyz

RESOLUTION = 2
CUTOFF_FACTOR = 0.6
KNN = 3


def haversine(lat_a: np.ndarray, lon_a: np.ndarray, lat_b: np.ndarray, lon_b: np.ndarray) -> np.ndarray:
    """Great-circle distance (radians) by the haversine formula, broadcasting over inputs in radians."""
    half_dlat = (lat_b - lat_a) / 2
    half_dlon = (lon_b - lon_a) / 2
    h = np.sin(half_dlat) ** 2 + np.cos(lat_a) * np.cos(lat_b) * np.sin(half_dlon) ** 2
    return 2 * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def pairwise_distances(source_latlon: np.ndarray, destination_latlon: np.ndarray) -> np.ndarray:
    """(N_destination, N_source) great-circle distances for [lat, lon] radian arrays."""
    return haversine(
        destination_latlon[:, None, 0],
        destination_latlon[:, None, 1],
        source_latlon[None, :, 0],
        source_latlon[None, :, 1],
    )


def edge_pairs(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.T.tolist()))


def cell_centred_grid(num_latitudes: int, num_longitudes: int) -> tuple[np.ndarray, np.ndarray]:
    latitudes = -90 + (np.arange(num_latitudes) + 0.5) * 180 / num_latitudes
    longitudes = np.arange(num_longitudes) * 360 / num_longitudes
    lat_grid, lon_grid = np.meshgrid(latitudes, longitudes, indexing="ij")
    return lat_grid.ravel(), lon_grid.ravel()


@pytest.fixture(scope="module")
def random_points() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    xyz = rng.normal(size=(200, 3))
    xyz /= np.linalg.norm(xyz, axis=1, keepdims=True)
    return np.rad2deg(np.arcsin(xyz[:, 2])), np.rad2deg(np.arctan2(xyz[:, 1], xyz[:, 0]))


@pytest.fixture(scope="module")
def random_graph(random_points):
    latitudes, longitudes = random_points
    return build_graph(latitudes, longitudes, mesh_resolution=RESOLUTION, cutoff_factor=CUTOFF_FACTOR, knn=KNN)


@pytest.mark.parametrize("resolution", range(5))
def test_hidden_node_count_and_nested_levels(resolution):
    latitudes, longitudes = cell_centred_grid(8, 16)
    graph = build_graph(latitudes, longitudes, mesh_resolution=resolution, processor_edges=False)
    assert graph["hidden"].num_nodes == 10 * 4**resolution + 2
    assert graph["hidden"].x.dtype == torch.float32
    assert PROCESSOR not in graph.edge_types
    mesh = refined_icosahedron(resolution=resolution)
    np.testing.assert_allclose(np.linalg.norm(mesh.vertices, axis=1), 1.0, atol=1e-12)
    for level in range(resolution + 1):
        coarse = refined_icosahedron(resolution=level).vertices
        np.testing.assert_array_equal(mesh.vertices[: len(coarse)], coarse)
        assert mesh.faces_per_level[level].shape == (20 * 4**level, 3)


def test_data_nodes_keep_caller_order_in_radians(random_points, random_graph):
    latitudes, longitudes = random_points
    expected = np.deg2rad(np.stack([latitudes, longitudes], axis=1))
    np.testing.assert_allclose(random_graph["data"].x.numpy(), expected, atol=1e-6)
    assert random_graph["data"].x.dtype == torch.float32


def test_decoder_knn_edges_match_brute_force(random_graph):
    distances = pairwise_distances(random_graph["hidden"].x.double().numpy(), random_graph["data"].x.double().numpy())
    nearest = np.argsort(distances, axis=1)[:, :KNN]
    expected = {(int(hidden), data) for data, row in enumerate(nearest) for hidden in row}
    assert edge_pairs(random_graph[DECODER].edge_index) == expected
    assert random_graph[DECODER].num_edges == KNN * random_graph["data"].num_nodes


def test_encoder_cutoff_edges_match_brute_force(random_graph):
    hidden = random_graph["hidden"].x.double().numpy()
    hidden_distances = pairwise_distances(hidden, hidden)
    np.fill_diagonal(hidden_distances, np.inf)
    radius = CUTOFF_FACTOR * hidden_distances.min(axis=1).max()
    distances = pairwise_distances(random_graph["data"].x.double().numpy(), hidden)
    assert np.abs(distances - radius).min() > 1e-6, "a point on the cutoff boundary makes the test ambiguous"
    hidden_index, data_index = np.nonzero(distances <= radius)
    assert len(hidden_index) > 0
    assert edge_pairs(random_graph[ENCODER].edge_index) == set(
        zip(data_index.tolist(), hidden_index.tolist(), strict=True)
    )
    assert random_graph.cutoff_radius == pytest.approx(radius, rel=1e-5)


def test_processor_edges_are_multiscale_mesh(random_graph):
    edge_index = random_graph[PROCESSOR].edge_index
    pairs = edge_pairs(edge_index)
    assert len(pairs) == edge_index.shape[1], "duplicate edges"
    assert all(source != destination for source, destination in pairs)
    assert pairs == {(destination, source) for source, destination in pairs}

    mesh = refined_icosahedron(resolution=RESOLUTION)
    undirected_per_level = [
        {
            tuple(sorted(side))
            for face in faces.tolist()
            for side in ((face[0], face[1]), (face[1], face[2]), (face[2], face[0]))
        }
        for faces in mesh.faces_per_level
    ]
    assert [len(edges) for edges in undirected_per_level] == [30 * 4**level for level in range(RESOLUTION + 1)]
    rank = np.argsort(hilbert_order(mesh.vertices))  # graph index of each mesh vertex
    expected = {(int(rank[a]), int(rank[b])) for a, b in set().union(*undirected_per_level[1:])}
    assert len(pairs) == 2 * sum(len(edges) for edges in undirected_per_level[1:])
    assert pairs == expected | {(b, a) for a, b in expected}


def test_hidden_nodes_follow_the_hilbert_curve():
    mesh = refined_icosahedron(resolution=3)
    graph = build_graph(*cell_centred_grid(16, 32), mesh_resolution=3)
    hidden_xyz = latlon_to_xyz(*graph["hidden"].x.double().numpy().T)
    np.testing.assert_allclose(hidden_xyz, mesh.vertices[hilbert_order(mesh.vertices)], atol=1e-6)
    steps = np.linalg.norm(np.diff(hidden_xyz, axis=0), axis=1)
    refinement_steps = np.linalg.norm(np.diff(mesh.vertices, axis=0), axis=1)
    assert np.median(steps) < 0.5 * np.median(refinement_steps)


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_hilbert_index_visits_neighbouring_cells_in_turn(bits):
    cells = 1 << bits
    centres = (np.stack(np.meshgrid(*[np.arange(cells)] * 3, indexing="ij"), -1).reshape(-1, 3) + 0.5) / cells
    index = hilbert_index(centres * 2 - 1, bits=bits)
    assert sorted(index.tolist()) == list(range(cells**3))
    path = centres[np.argsort(index)] * cells
    np.testing.assert_allclose(np.abs(np.diff(path, axis=0)).sum(axis=1), 1.0)


def test_encoder_chunks_of_the_hilbert_order_reference_fewer_sources():
    graph = build_graph(*cell_centred_grid(48, 96), mesh_resolution=3)
    source, destination = graph[ENCODER].edge_index.numpy()
    num_hidden = graph["hidden"].num_nodes
    refinement_index = hilbert_order(refined_icosahedron(resolution=3).vertices)  # of each graph hidden node

    def largest_chunk_sources(destination_index: np.ndarray) -> int:
        bounds = np.linspace(0, num_hidden, 5).astype(int)
        return max(
            len(np.unique(source[(destination_index >= lo) & (destination_index < hi)]))
            for lo, hi in itertools.pairwise(bounds)
        )

    assert largest_chunk_sources(destination) < 0.85 * largest_chunk_sources(refinement_index[destination])


@pytest.mark.parametrize(("grid", "resolution", "expected_edges"), [((32, 64), 3, 5040), ((8, 16), 4, 20400)])
def test_processor_edge_count_matches_reference(grid, resolution, expected_edges):
    graph = build_graph(*cell_centred_grid(*grid), mesh_resolution=resolution)
    assert graph[PROCESSOR].num_edges == expected_edges


def test_resolution_zero_processor_is_the_icosahedron():
    graph = build_graph(*cell_centred_grid(8, 16), mesh_resolution=0)
    edge_index = graph[PROCESSOR].edge_index
    assert edge_index.shape == (2, 60)
    assert torch.bincount(edge_index[1]).tolist() == [5] * 12
    hidden = graph["hidden"].x.double().numpy()
    lengths = haversine(*hidden[edge_index[0]].T, *hidden[edge_index[1]].T)
    np.testing.assert_allclose(lengths, np.arccos(1 / np.sqrt(5)), rtol=1e-6)


def test_edge_sets_sorted_by_destination(random_graph):
    for edge_type in (ENCODER, PROCESSOR, DECODER):
        source, destination = random_graph[edge_type].edge_index.numpy()
        assert random_graph[edge_type].edge_index.dtype == torch.int64
        order = np.lexsort((source, destination))
        np.testing.assert_array_equal(order, np.arange(len(order)), err_msg=str(edge_type))


def test_edge_length_attribute_proportional_to_great_circle_distance(random_graph):
    for edge_type in (ENCODER, PROCESSOR, DECODER):
        store = random_graph[edge_type]
        source_nodes = random_graph[edge_type[0]].x.double().numpy()
        destination_nodes = random_graph[edge_type[2]].x.double().numpy()
        source, destination = store.edge_index.numpy()
        lengths = haversine(*source_nodes[source].T, *destination_nodes[destination].T)
        attributes = store.edge_attr.double().numpy()
        assert store.edge_attr.shape == (store.num_edges, 3)
        np.testing.assert_allclose(attributes[:, 0], lengths / lengths.std(), rtol=1e-4)
        np.testing.assert_allclose(attributes.std(axis=0), 1.0, rtol=1e-4)


def latlon_deg_to_xyz(latitude: float, longitude: float) -> np.ndarray:
    latitude, longitude = np.deg2rad(latitude), np.deg2rad(longitude)
    return np.array([[np.cos(latitude) * np.cos(longitude), np.cos(latitude) * np.sin(longitude), np.sin(latitude)]])


@pytest.mark.parametrize(
    ("destination", "source", "expected"),
    [
        ((0.0, 0.0), (0.0, 10.0), (0.0, 1.0)),  # due east on the equator
        ((0.0, 0.0), (0.0, -10.0), (0.0, -1.0)),  # due west
        ((0.0, 0.0), (10.0, 0.0), (-1.0, 0.0)),  # due north
        ((45.0, 120.0), (50.0, 120.0), (-1.0, 0.0)),  # due north along a meridian, away from the equator
        ((-30.0, -60.0), (-35.0, -60.0), (1.0, 0.0)),  # due south
    ],
)
def test_edge_direction_hand_checked(destination, source, expected):
    direction = edge_directions(latlon_deg_to_xyz(*source), latlon_deg_to_xyz(*destination))
    np.testing.assert_allclose(direction[0], expected, atol=1e-12)


def test_edge_directions_have_unit_norm():
    rng = np.random.default_rng(1)
    points = rng.normal(size=(2, 500, 3))
    points /= np.linalg.norm(points, axis=-1, keepdims=True)
    np.testing.assert_allclose(np.linalg.norm(edge_directions(points[0], points[1]), axis=1), 1.0, rtol=1e-12)


def test_area_weights_follow_cos_latitude_on_regular_grid():
    latitudes, longitudes = cell_centred_grid(32, 64)
    graph = build_graph(latitudes, longitudes, mesh_resolution=2, processor_edges=False)
    weights = graph["data"].area_weight.double().numpy()
    assert graph["data"].area_weight.dtype == torch.float32
    assert (weights > 0).all()
    assert weights.mean() == pytest.approx(1.0, rel=1e-6)
    cos_latitude = np.cos(np.deg2rad(latitudes))
    np.testing.assert_allclose(weights, cos_latitude / cos_latitude.mean(), rtol=0.03)


def test_area_weights_split_coincident_pole_points():
    latitudes = np.concatenate([np.full(8, 90.0), np.full(8, 0.0), np.full(8, -90.0)])
    longitudes = np.tile(np.arange(8) * 45.0, 3)
    graph = build_graph(latitudes, longitudes, mesh_resolution=0, processor_edges=False)
    weights = graph["data"].area_weight.double().numpy()

    distinct = np.concatenate([latlon_deg_to_xyz(90.0, 0.0), latlon_deg_to_xyz(-90.0, 0.0)])
    distinct = np.concatenate([distinct, *(latlon_deg_to_xyz(0.0, longitude) for longitude in longitudes[8:16])])
    distinct_areas = SphericalVoronoi(distinct).calculate_areas()
    expected = np.concatenate(
        [np.full(8, distinct_areas[0] / 8), distinct_areas[2:], np.full(8, distinct_areas[1] / 8)]
    )
    np.testing.assert_allclose(weights, expected / expected.mean(), rtol=1e-5)


def test_tensor_round_trip(random_graph):
    tensors = graph_to_tensors(random_graph)
    assert all(isinstance(value, torch.Tensor) for value in tensors.values())
    restored = graph_from_tensors(tensors)
    assert set(restored.node_types) == set(random_graph.node_types)
    assert set(restored.edge_types) == set(random_graph.edge_types)
    assert restored.mesh_resolution == RESOLUTION and isinstance(restored.mesh_resolution, int)
    assert restored.knn == KNN
    restored_tensors = graph_to_tensors(restored)
    assert restored_tensors.keys() == tensors.keys()
    for name, tensor in tensors.items():
        assert torch.equal(restored_tensors[name], tensor), name
    assert graph_fingerprint(restored) == graph_fingerprint(random_graph)


def test_fingerprint_changes_with_content(random_graph):
    tensors = graph_to_tensors(random_graph)
    tensors["node/data/area_weight"] = tensors["node/data/area_weight"] * 2
    assert graph_fingerprint(graph_from_tensors(tensors)) != graph_fingerprint(random_graph)


def test_cache_reuses_file_and_keys_on_spec(tmp_path, monkeypatch, caplog, random_points):
    latitudes, longitudes = random_points
    first = load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=1)
    cache_files = sorted(tmp_path.glob("graph-*.pt"))
    assert len(cache_files) == 1
    assert list(tmp_path.iterdir()) == cache_files, "temporary file left behind"

    def fail_to_build(*args, **kwargs):
        raise AssertionError("graph was rebuilt instead of loaded from the cache")

    monkeypatch.setattr(graph_cache, "build_graph", fail_to_build)
    with caplog.at_level(logging.INFO, logger=graph_cache.__name__):
        second = load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=1)
    assert any("Loaded graph" in record.getMessage() for record in caplog.records)
    assert graph_fingerprint(second) == graph_fingerprint(first)
    monkeypatch.undo()

    load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=1, knn=2)
    load_or_build_graph(latitudes[::-1], longitudes[::-1], cache_dir=tmp_path, mesh_resolution=1)
    assert len(list(tmp_path.glob("graph-*.pt"))) == 3


def test_no_cache_dir_builds_without_writing(tmp_path, random_points, monkeypatch):
    monkeypatch.chdir(tmp_path)
    graph = load_or_build_graph(*random_points, cache_dir=None, mesh_resolution=1, processor_edges=False)
    assert PROCESSOR not in graph.edge_types
    assert list(tmp_path.iterdir()) == []


def test_unconnected_data_nodes_are_reported(caplog, random_points):
    with caplog.at_level(logging.WARNING, logger="anemo_like.graphs.builder"):
        build_graph(*random_points, mesh_resolution=1, cutoff_factor=0.05, processor_edges=False)
    assert any("no encoder edge" in record.getMessage() for record in caplog.records)

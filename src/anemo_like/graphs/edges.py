"""Edge sets between points on the unit sphere: cut-off radius, k nearest neighbours, multi-scale mesh.

Every function returns edge_index int64 (2, E) = [source; destination], sorted by destination
(stable, ties by source ascending).
"""

import itertools
from collections.abc import Iterable

import numpy as np
from scipy.spatial import cKDTree

from anemo_like.graphs.icosahedron import RefinedIcosahedron, triangle_edges
from anemo_like.sphere import arc_to_chord, great_circle_distance

# Chord search radius slack; candidates are then filtered on the exact great-circle distance.
_SEARCH_SLACK = 1.0 + 1e-9


def sort_by_destination(edge_index: np.ndarray) -> np.ndarray:
    """Reorder edges (2, E) by destination, ties by source index ascending."""
    order = np.lexsort((edge_index[0], edge_index[1]))
    return np.ascontiguousarray(edge_index[:, order])


def max_nearest_neighbour_distance(xyz: np.ndarray) -> float:
    """Largest great-circle distance (radians) from any point (N >= 2, 3) to its nearest other point."""
    _, neighbours = cKDTree(xyz).query(xyz, k=2)
    return float(great_circle_distance(xyz, xyz[neighbours[:, 1]]).max())


def cutoff_edges(source_xyz: np.ndarray, destination_xyz: np.ndarray, *, radius: float) -> np.ndarray:
    """Edges j -> i for every source j within great-circle distance `radius` (radians) of destination i."""
    candidates = cKDTree(destination_xyz).sparse_distance_matrix(
        cKDTree(source_xyz), max_distance=arc_to_chord(radius) * _SEARCH_SLACK, output_type="ndarray"
    )
    destinations = candidates["i"].astype(np.int64)
    sources = candidates["j"].astype(np.int64)
    within = great_circle_distance(source_xyz[sources], destination_xyz[destinations]) <= radius
    return sort_by_destination(np.stack([sources[within], destinations[within]]))


def variable_radius_edges(source_xyz: np.ndarray, destination_xyz: np.ndarray, *, radii: np.ndarray) -> np.ndarray:
    """Edges j -> i for every source j within great-circle distance radii[i] (radians, (N_destination,)) of i."""
    tree = cKDTree(source_xyz)
    neighbours = tree.query_ball_point(destination_xyz, r=arc_to_chord(np.asarray(radii)) * _SEARCH_SLACK)
    counts = np.fromiter(map(len, neighbours), dtype=np.int64, count=len(destination_xyz))
    sources = np.fromiter(itertools.chain.from_iterable(neighbours), dtype=np.int64, count=int(counts.sum()))
    destinations = np.repeat(np.arange(len(destination_xyz), dtype=np.int64), counts)
    within = great_circle_distance(source_xyz[sources], destination_xyz[destinations]) <= radii[destinations]
    return sort_by_destination(np.stack([sources[within], destinations[within]]))


def knn_edges(source_xyz: np.ndarray, destination_xyz: np.ndarray, *, k: int) -> np.ndarray:
    """Edges from the `k` nearest sources (great-circle distance) to every destination."""
    if not 1 <= k <= len(source_xyz):
        raise ValueError(f"k must be in [1, {len(source_xyz)}], got {k}")
    _, nearest = cKDTree(source_xyz).query(destination_xyz, k=k)
    nearest = nearest.reshape(len(destination_xyz), k)
    destinations = np.repeat(np.arange(len(destination_xyz), dtype=np.int64), k)
    return sort_by_destination(np.stack([nearest.ravel().astype(np.int64), destinations]))


def multiscale_mesh_edges(mesh: RefinedIcosahedron, *, levels: Iterable[int]) -> np.ndarray:
    """Union of the triangle edges of the given refinement levels, in both directions.

    Vertex indices are shared across levels, so a coarse-level edge links two vertices that are far
    apart on the finest mesh. No self loops and no duplicates.
    """
    num_vertices = len(mesh.vertices)
    undirected = [triangle_edges(mesh.faces_per_level[level], num_vertices)[0] for level in levels]
    pairs = np.unique(np.concatenate([np.empty((0, 2), dtype=np.int64), *undirected]), axis=0)
    both_directions = np.concatenate([pairs, pairs[:, ::-1]]).T
    return sort_by_destination(both_directions)

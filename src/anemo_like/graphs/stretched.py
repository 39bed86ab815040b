"""Hidden meshes over part of the sphere: stretched (coarse everywhere, fine over a region and its margin) and
limited-area (fine over the data only), both cut from one refined icosahedron."""

import logging
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from anemo_like.config.model_schema import LimitedAreaHidden, StretchedHidden, mesh_nodes
from anemo_like.graphs.edges import sort_by_destination
from anemo_like.graphs.icosahedron import RefinedIcosahedron, refined_icosahedron, triangle_edges
from anemo_like.graphs.ordering import hilbert_order
from anemo_like.sphere import EARTH_RADIUS_KM, arc_to_chord, great_circle_distance

LOGGER = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegionalMesh:
    """Kept hidden nodes in Hilbert order and their multi-scale processor edges.

    xyz: float64 (N, 3) unit vectors. processor_index: int64 (2, E), both directions, sorted by destination.
    spacing: float64 (N,) radians, the longest kept edge of each node's finest level (its local mesh spacing).
    """

    xyz: np.ndarray
    processor_index: np.ndarray
    spacing: np.ndarray


def grid_spacing(xyz: np.ndarray) -> float:
    """Median great-circle distance (radians) from each point of xyz (N, 3) to its nearest other point (0 for a
    single point)."""
    if len(xyz) < 2:
        return 0.0
    _, neighbours = cKDTree(xyz).query(xyz, k=2)
    return float(np.median(great_circle_distance(xyz, xyz[neighbours[:, 1]])))


def near_points(vertices: np.ndarray, points_xyz: np.ndarray, margin_km: float) -> np.ndarray:
    """bool (V,): vertices within margin_km plus the points' median spacing of any point of points_xyz (P, 3).

    The spacing is added so that a margin of 0 still covers the area between the points.
    """
    radius = margin_km / EARTH_RADIUS_KM + grid_spacing(points_xyz)
    distances, _ = cKDTree(points_xyz).query(vertices, distance_upper_bound=arc_to_chord(min(radius, np.pi)))
    return np.isfinite(distances)


def _kept_edges_and_spacing(mesh: RefinedIcosahedron, kept: np.ndarray, levels: range) -> tuple[np.ndarray, np.ndarray]:
    """Undirected triangle edges (E, 2) of ``levels`` with both ends kept, and every vertex's spacing (V,): the
    longest of its kept edges at the finest level where it has one (NaN without any). A coarse vertex at the rim of
    the fine area thus has the fine spacing: its encoder radius stays local to the region."""
    num_vertices = len(mesh.vertices)
    spacing = np.full(num_vertices, np.nan)
    pairs = []
    for level in reversed(levels):
        edges = triangle_edges(mesh.faces_per_level[level], num_vertices)[0]
        edges = edges[kept[edges].all(axis=1)]
        lengths = great_circle_distance(mesh.vertices[edges[:, 0]], mesh.vertices[edges[:, 1]])
        longest = np.zeros(num_vertices)
        for end in (0, 1):
            np.maximum.at(longest, edges[:, end], lengths)
        unset = np.isnan(spacing) & (longest > 0)
        spacing[unset] = longest[unset]
        pairs.append(edges)
    return np.unique(np.concatenate([np.empty((0, 2), dtype=np.int64), *pairs]), axis=0), spacing


def _connected(kept: np.ndarray, pairs: np.ndarray, anchor: int | None) -> np.ndarray:
    """``kept`` reduced to one connected component of the edges ``pairs`` (E, 2): the one holding vertex
    ``anchor``, or the largest when None. Logs how many kept vertices that drops."""
    num_vertices = len(kept)
    adjacency = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(num_vertices, num_vertices))
    _, labels = connected_components(adjacency, directed=False)
    label = labels[anchor] if anchor is not None else np.bincount(labels[kept]).argmax()
    connected = kept & (labels == label)
    dropped = int(kept.sum() - connected.sum())
    if dropped:
        LOGGER.warning("%d hidden nodes are not connected to the rest of the mesh and are left out", dropped)
    return connected


def regional_mesh(
    data_xyz: np.ndarray, region: np.ndarray | None, hidden: StretchedHidden | LimitedAreaHidden
) -> RegionalMesh:
    """The hidden mesh of a stretched or limited-area graph for data points data_xyz (G, 3).

    Stretched: the level-``global_resolution`` vertices everywhere plus every vertex up to level
    ``region_resolution`` near the points where ``region`` (G,) bool is True. Limited-area: the level
    ``region_resolution`` vertices near any data point (``region`` is not used). Processor edges: the triangle
    edges of levels 1..region_resolution (level 0 too when global_resolution is 0) with both ends kept.
    """
    mesh = refined_icosahedron(resolution=hidden.region_resolution)
    if isinstance(hidden, StretchedHidden):
        if region is None or not region.any():
            raise ValueError(
                "graph.hidden kind stretched needs the dataset's region mask with at least one regional point "
                "(a combined grid, data.cutout); this dataset has none: use kind icosahedral or limited_area"
            )
        kept = near_points(mesh.vertices, data_xyz[region], hidden.margin_km)
        kept[: mesh_nodes(hidden.global_resolution)] = True
        levels, anchor = range(min(1, hidden.global_resolution), hidden.region_resolution + 1), 0
    else:
        kept = near_points(mesh.vertices, data_xyz, hidden.margin_km)
        if kept.sum() < 3:  # a triangle, the smallest mesh
            raise ValueError(
                f"graph.hidden kind limited_area: {kept.sum()} mesh nodes of region_resolution "
                f"{hidden.region_resolution} lie within margin_km {hidden.margin_km:g} of the data, fewer than a "
                "triangle's 3; raise graph.hidden.margin_km or graph.hidden.region_resolution"
            )
        levels, anchor = range(1, hidden.region_resolution + 1), None
    pairs, spacing = _kept_edges_and_spacing(mesh, kept, levels)
    kept = _connected(kept, pairs, anchor)
    pairs = pairs[kept[pairs].all(axis=1)]

    kept_index = np.flatnonzero(kept)
    order = kept_index[hilbert_order(mesh.vertices[kept_index])]
    rank = np.full(len(kept), -1, dtype=np.int64)
    rank[order] = np.arange(len(order))
    both_directions = np.concatenate([pairs, pairs[:, ::-1]]).T
    return RegionalMesh(
        xyz=mesh.vertices[order], processor_index=sort_by_destination(rank[both_directions]), spacing=spacing[order]
    )

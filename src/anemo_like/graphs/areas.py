"""Spherical Voronoi cell areas of grid points, used as loss/area weights."""

import numpy as np
from scipy.spatial import SphericalVoronoi, cKDTree

from anemo_like.graphs.icosahedron import icosahedron
from anemo_like.sphere import arc_to_chord, great_circle_distance

# Points whose unit vectors agree to this many decimals are one generator (e.g. a pole row).
_DUPLICATE_DECIMALS = 9
# Neighbours considered around each point of a regional grid, and the directions (equal sectors of the tangent plane)
# in each of which the nearest one is mirrored through the point to find the space just outside the grid.
_NEIGHBOURS = 16
_SECTORS = 8
# A mirrored neighbour lies outside the grid when no grid point is closer to it than this fraction of its distance
# from the point it was mirrored through (inside a grid it lands on, or near, another grid point).
_OUTSIDE_FRACTION = 0.75
# Directions of the sphere farther than this many grid spacings from a regional grid get a generator of their own.
_FAR_SPACINGS = 4.0
# Mirrored points closer together than this fraction of the smallest mirror distance count as one.
_SAME_GHOST_FRACTION = 0.01


def _cell_areas(xyz: np.ndarray) -> np.ndarray:
    """float64 (N,) spherical Voronoi area (steradians) of each unit vector (N, 3); coincident points share."""
    _, first_index, inverse, counts = np.unique(
        np.round(xyz, _DUPLICATE_DECIMALS), axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    voronoi = SphericalVoronoi(xyz[first_index], radius=1.0)
    return (voronoi.calculate_areas() / counts)[inverse.ravel()]


def area_weights(xyz: np.ndarray) -> np.ndarray:
    """float32 (N,) spherical Voronoi area of each unit vector (N, 3), normalised to mean 1.

    Coincident points (e.g. every longitude at a pole) share their cell's area equally.
    """
    areas_per_point = _cell_areas(xyz)
    return (areas_per_point / areas_per_point.mean()).astype(np.float32)


def _sector_neighbours(xyz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each point of xyz (N, 3) and each of _SECTORS directions around it, the nearest neighbour in that
    direction: (point, neighbour) index pairs, int64 (M,) each."""
    count = min(_NEIGHBOURS + 1, len(xyz))
    _, neighbours = cKDTree(xyz).query(xyz, k=count)
    neighbours = neighbours[:, 1:]  # (N, count - 1), nearest first
    reference = np.where(np.abs(xyz[:, 2:]) > 0.9, [[1.0, 0.0, 0.0]], [[0.0, 0.0, 1.0]])
    first = np.cross(reference, xyz)
    first /= np.linalg.norm(first, axis=1, keepdims=True)
    second = np.cross(xyz, first)  # (first, second): an orthonormal frame of each point's tangent plane
    offsets = xyz[neighbours] - xyz[:, None, :]
    angles = np.arctan2(np.sum(offsets * second[:, None], axis=-1), np.sum(offsets * first[:, None], axis=-1))
    sectors = ((angles + np.pi) * _SECTORS / (2 * np.pi)).astype(np.int64) % _SECTORS
    points, neighbour = [], []
    for sector in range(_SECTORS):
        in_sector = sectors == sector
        has = in_sector.any(axis=1)
        points.append(np.flatnonzero(has))
        neighbour.append(neighbours[has, np.argmax(in_sector[has], axis=1)])
    return np.concatenate(points), np.concatenate(neighbour)


def outside_points(xyz: np.ndarray) -> np.ndarray:
    """float64 (M, 3) points just outside a regional grid xyz (N, 3), at its local spacing.

    In each direction around each point, its nearest neighbour is mirrored through it (rotated by 180 degrees about
    it); mirror images with no grid point nearby lie beyond the grid's edge, and inside a locally regular grid none
    survive.
    """
    points, neighbours = _sector_neighbours(xyz)
    centres, sources = xyz[points], xyz[neighbours]
    mirrored = 2.0 * np.sum(centres * sources, axis=1, keepdims=True) * centres - sources
    mirror_distance = great_circle_distance(centres, sources)
    nearest, _ = cKDTree(xyz).query(mirrored)
    outside = nearest >= arc_to_chord(_OUTSIDE_FRACTION * mirror_distance)
    ghosts = mirrored[outside]
    if len(ghosts) < 2:
        return ghosts
    same_radius = arc_to_chord(_SAME_GHOST_FRACTION * mirror_distance[outside].min())
    same = cKDTree(ghosts).query_pairs(same_radius, output_type="ndarray")
    return np.delete(ghosts, np.unique(same[:, 1]), axis=0)


def _far_anchors(generators: np.ndarray) -> np.ndarray:
    """The icosahedron's vertices (up to 12, 3) farther than _FAR_SPACINGS nearest-neighbour spacings from every
    generator (N, 3): they keep a small region's Voronoi diagram from being flat, and are too far to touch its cells."""
    tree = cKDTree(generators)
    spacing = tree.query(generators, k=2)[0][:, 1].max()
    vertices = icosahedron()[0]
    return vertices[tree.query(vertices)[0] > _FAR_SPACINGS * spacing]


def regional_area_weights(xyz: np.ndarray) -> np.ndarray:
    """float32 (N,) like :func:`area_weights` for a grid covering part of the sphere: the cells of its edge points
    end about half a grid spacing outside it (points outside the grid bound them, then are dropped), instead of
    covering the rest of the sphere."""
    generators = np.concatenate([xyz, outside_points(xyz)])
    areas_per_point = _cell_areas(np.concatenate([generators, _far_anchors(generators)]))[: len(xyz)]
    return (areas_per_point / areas_per_point.mean()).astype(np.float32)

"""Geometry of grid points on the sphere: unit vectors, great-circle distances in km, a grid's spacing and a
Fibonacci lattice over a spherical cap."""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from anemo_like.sphere import EARTH_RADIUS_KM, latlon_to_xyz

_GOLDEN_ANGLE = np.pi * (3.0 - np.sqrt(5.0))


def unit_vectors(latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """(N,) degrees -> (N, 3) float64 points on the unit sphere."""
    return latlon_to_xyz(np.deg2rad(np.asarray(latitudes, np.float64)), np.deg2rad(np.asarray(longitudes, np.float64)))


def chord_to_km(chord: np.ndarray | float) -> np.ndarray:
    """Straight-line distance between unit vectors -> great-circle distance in km."""
    return 2.0 * EARTH_RADIUS_KM * np.arcsin(np.clip(np.asarray(chord, dtype=np.float64) / 2.0, 0.0, 1.0))


def km_to_chord(km: np.ndarray | float) -> np.ndarray:
    """Great-circle distance in km -> straight-line distance between unit vectors."""
    return 2.0 * np.sin(np.clip(np.asarray(km, dtype=np.float64) / EARTH_RADIUS_KM, 0.0, np.pi) / 2.0)


def nearest_km(points: np.ndarray, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For (Q, 3) unit vectors ``queries``: the great-circle distance (km) to the nearest of (N, 3) ``points`` and
    its index, each (Q,)."""
    chord, index = cKDTree(points).query(queries)
    return chord_to_km(chord), np.asarray(index, dtype=np.int64)


def spacing_km(points: np.ndarray) -> float:
    """A grid's spacing: the median great-circle distance (km) from each of (N, 3) ``points`` to its nearest other
    point (duplicates left out); NaN for fewer than two distinct points."""
    if len(points) < 2:
        return float("nan")
    chord, _ = cKDTree(points).query(points, k=2)
    distances = chord[:, 1][chord[:, 1] > 1e-12]
    return float(np.median(chord_to_km(distances))) if distances.size else float("nan")


def cap_lattice(centre: np.ndarray, radius: float, spacing: float) -> np.ndarray:
    """(M, 3) unit vectors of a Fibonacci lattice with about ``spacing`` (radians) between neighbours, restricted to
    the cap of angular ``radius`` (radians) around unit vector ``centre``."""
    total = max(int(np.ceil(4.0 * np.pi / spacing**2)), 1)
    z = 1.0 - (2.0 * np.arange(total) + 1.0) / total  # the lattice's z, from the north pole down
    index = np.flatnonzero(z >= np.cos(min(radius, np.pi)))
    r, phi = np.sqrt(1.0 - z[index] ** 2), _GOLDEN_ANGLE * index
    points = np.stack([r * np.cos(phi), r * np.sin(phi), z[index]], axis=-1)
    return points @ _rotation_from_pole(np.asarray(centre, dtype=np.float64)).T


def _rotation_from_pole(centre: np.ndarray) -> np.ndarray:
    """(3, 3) rotation taking the north pole (0, 0, 1) to unit vector ``centre``."""
    pole = np.array([0.0, 0.0, 1.0])
    axis, cos = np.cross(pole, centre), float(np.dot(pole, centre))
    if np.linalg.norm(axis) < 1e-12:
        return np.eye(3) if cos > 0 else np.diag([1.0, -1.0, -1.0])
    cross = np.array([[0.0, -axis[2], axis[1]], [axis[2], 0.0, -axis[0]], [-axis[1], axis[0], 0.0]])
    return np.eye(3) + cross + cross @ cross / (1.0 + cos)

"""Coordinate conversions and distances on the unit sphere."""

import numpy as np

EARTH_RADIUS_KM = 6371.0  # mean radius: great-circle distances in radians times this are kilometres


def latlon_to_xyz(latitudes_rad: np.ndarray, longitudes_rad: np.ndarray) -> np.ndarray:
    """Unit vectors float64 (N, 3) for latitudes/longitudes (N,) in radians."""
    cos_lat = np.cos(latitudes_rad)
    return np.stack(
        [cos_lat * np.cos(longitudes_rad), cos_lat * np.sin(longitudes_rad), np.sin(latitudes_rad)], axis=-1
    )


def xyz_to_latlon(xyz: np.ndarray) -> np.ndarray:
    """[lat, lon] float64 (N, 2) in radians, lon in (-pi, pi], for unit vectors (N, 3)."""
    latitudes = np.arcsin(np.clip(xyz[:, 2], -1.0, 1.0))
    longitudes = np.arctan2(xyz[:, 1], xyz[:, 0])
    return np.stack([latitudes, longitudes], axis=-1)


def great_circle_distance(a_xyz: np.ndarray, b_xyz: np.ndarray) -> np.ndarray:
    """Angle in radians (...,) between unit vectors a and b (..., 3); accurate for tiny and large angles."""
    cross_norm = np.linalg.norm(np.cross(a_xyz, b_xyz), axis=-1)
    dot = np.sum(a_xyz * b_xyz, axis=-1)
    return np.arctan2(cross_norm, dot)


def arc_to_chord(arc_rad: float | np.ndarray) -> float | np.ndarray:
    """Straight-line distance between two unit vectors separated by `arc_rad` radians (a number or an array)."""
    return 2.0 * np.sin(arc_rad / 2.0)

"""Spherical Voronoi cell areas of grid points, used as loss/area weights."""

import numpy as np
from scipy.spatial import SphericalVoronoi

# Points whose unit vectors agree to this many decimals are one generator (e.g. a pole row).
_DUPLICATE_DECIMALS = 9


def area_weights(xyz: np.ndarray) -> np.ndarray:
    """float32 (N,) spherical Voronoi area of each unit vector (N, 3), normalised to mean 1.

    Coincident points (e.g. every longitude at a pole) share their cell's area equally.
    """
    _, first_index, inverse, counts = np.unique(
        np.round(xyz, _DUPLICATE_DECIMALS), axis=0, return_index=True, return_inverse=True, return_counts=True
    )
    voronoi = SphericalVoronoi(xyz[first_index], radius=1.0)
    areas_per_point = (voronoi.calculate_areas() / counts)[inverse.ravel()]
    return (areas_per_point / areas_per_point.mean()).astype(np.float32)

"""Linear interpolation on the sphere from scattered source points to target points.

The source points are triangulated by their spherical Delaunay triangulation: the facets of the convex hull of
their unit vectors. Each target takes the barycentric weights of the facet its direction passes through, so the
interpolation is exact at the source points and reproduces, at a target, any linear function of xyz evaluated
where the target's ray meets the (flat) facet. Weights sum to one (constants are kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import ConvexHull, cKDTree

from anemo_like.data.sphere import unit_vectors

CANDIDATE_NEIGHBOURS = 6  # facets touching a target's 6 nearest source points are tried first
_TOLERANCE = 1e-9  # barycentric coordinates down to -1e-9 count as inside (round-off on an edge)
_SAME_POINT = 1e-10  # a target this close (chord) to a source point takes its value exactly
_FALLBACK_BATCH = 64  # targets tried against every facet at once when no candidate contains them


@dataclass(frozen=True, kw_only=True)
class SphericalInterpolator:
    """Weights of a linear interpolation: target t is sum_k weights[t, k] * source[indices[t, k]]."""

    indices: np.ndarray  # (T, 3) int64, source points of each target's triangle
    weights: np.ndarray  # (T, 3) float64, barycentric weights, summing to 1 per target

    def apply(self, values: np.ndarray) -> np.ndarray:
        """(..., S) values at the source points -> (..., T) float64 at the targets."""
        values = np.asarray(values, dtype=np.float64)
        total = values[..., self.indices[:, 0]] * self.weights[:, 0]
        for k in (1, 2):  # in a fixed order: the same targets give the same values bit for bit
            total += values[..., self.indices[:, k]] * self.weights[:, k]
        return total


def spherical_interpolator(
    source_latitudes: np.ndarray,
    source_longitudes: np.ndarray,
    target_latitudes: np.ndarray,
    target_longitudes: np.ndarray,
) -> SphericalInterpolator:
    """Barycentric weights of each target (degrees, (T,)) in the Delaunay triangle of the source points (degrees,
    (S,), at least 4 not on one plane) that contains it. Raises ValueError naming the first target no triangle
    contains (the source points do not surround it)."""
    source = unit_vectors(source_latitudes, source_longitudes)
    target = unit_vectors(target_latitudes, target_longitudes)
    hull = ConvexHull(source)
    facets = np.asarray(hull.simplices, dtype=np.int64)  # (F, 3)
    inverse = _facet_inverses(source, facets)
    tree = cKDTree(source)
    _, nearest = tree.query(target, k=min(CANDIDATE_NEIGHBOURS, len(source)))
    nearest = nearest.reshape(len(target), -1)
    candidates = _facets_touching(facets, len(source))[nearest].reshape(len(target), -1)  # (T, C), -1 padded
    best, coefficients = _best_facets(target, candidates, inverse)
    missing = np.flatnonzero(best < 0)
    for start in range(0, len(missing), _FALLBACK_BATCH):
        batch = missing[start : start + _FALLBACK_BATCH]
        every = np.broadcast_to(np.arange(len(facets)), (len(batch), len(facets)))
        best[batch], coefficients[batch] = _best_facets(target[batch], every, inverse)
    if (best < 0).any():
        t = int(np.flatnonzero(best < 0)[0])
        raise ValueError(
            f"cannot interpolate to {int((best < 0).sum())} target point(s), e.g. ({target_latitudes[t]:g}, "
            f"{target_longitudes[t]:g}): no triangle of the {len(source)} source points contains it"
        )
    indices, weights = facets[best], coefficients / coefficients.sum(axis=1, keepdims=True)
    distance, closest = tree.query(target)
    same = distance < _SAME_POINT
    indices[same], weights[same] = closest[same, None], np.array([1.0, 0.0, 0.0])
    return SphericalInterpolator(indices=indices, weights=weights)


def _facet_inverses(points: np.ndarray, facets: np.ndarray) -> np.ndarray:
    """(F, 3, 3) inverses of the matrices whose columns are each facet's vertices; NaN for a facet whose plane
    passes through the centre (three points on one great circle: the flat side of the hull of a regional grid)."""
    matrices = np.transpose(points[facets], (0, 2, 1))
    flat = np.abs(np.linalg.det(matrices)) < 1e-12
    matrices[flat] = np.eye(3)
    inverse = np.linalg.inv(matrices)
    inverse[flat] = np.nan
    return inverse


def _facets_touching(facets: np.ndarray, num_points: int) -> np.ndarray:
    """(S, D) facets touching each source point, padded with -1 (D the largest number touching one point)."""
    vertex = facets.ravel()
    facet = np.repeat(np.arange(len(facets)), 3)
    order = np.argsort(vertex, kind="stable")
    vertex, facet = vertex[order], facet[order]
    counts = np.bincount(vertex, minlength=num_points)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table = np.full((num_points, max(int(counts.max(initial=0)), 1)), -1, dtype=np.int64)
    table[vertex, np.arange(len(vertex)) - starts[vertex]] = facet
    return table


def _best_facets(target: np.ndarray, candidates: np.ndarray, inverse: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For (T, 3) targets and (T, C) candidate facets (-1: none): the containing facet whose plane is met first
    along the target's ray ((T,) index, -1 if none contains it) and its barycentric coefficients (T, 3)."""
    safe = np.maximum(candidates, 0)
    coefficients = np.einsum("tcij,tj->tci", inverse[safe], target)  # target = sum_i c_i vertex_i
    total = coefficients.sum(axis=2)
    inside = (candidates >= 0) & (coefficients.min(axis=2) >= -_TOLERANCE * total) & (total > 0)
    # the ray meets a facet's plane at target / total: the outermost plane (smallest total) is the sphere's surface
    choice = np.where(inside, total, np.inf).argmin(axis=1)
    rows = np.arange(len(target))
    best = np.where(inside[rows, choice], candidates[rows, choice], -1)
    return best, coefficients[rows, choice]

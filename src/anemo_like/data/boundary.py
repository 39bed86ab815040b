"""A limited-area dataset with forced boundary values: the strip of regional points near the edge of the region
takes the values of a global source interpolated there, read lazily from both stores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from anemo_like.data.interpolation import SphericalInterpolator, spherical_interpolator
from anemo_like.data.point_masks import BOUNDARY
from anemo_like.data.sphere import cap_lattice, nearest_km, spacing_km, unit_vectors
from anemo_like.data.views import DatasetView, check_combinable, check_surrounded
from anemo_like.data.zarr_store import AnemoiZarr
from anemo_like.sphere import EARTH_RADIUS_KM

SURROUNDING_NEIGHBOURS = 16  # an auxiliary point is inside the region when these nearest regional points surround it
GLOBAL_SPREAD = 0.9 * np.pi  # points reaching this far (radians) from their centre cover the globe: no edge
AUXILIARY_DENSITY = 4.0  # auxiliary points lie at a quarter of the regional spacing: distances to the edge are
# exact to about 0.2 spacings
_CAP_MARGIN_SPACINGS = 4.0  # auxiliary points reach this many regional spacings beyond the farthest regional point


def edge_distance_km(latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """(N,) great-circle distance (km) of each regional point (degrees) to the edge of the region, which lies half a
    grid spacing beyond the outermost points: the outer row is at 0.5 spacings, the next at 1.5, and so on.

    Auxiliary points of a Fibonacci lattice at a quarter of the regional spacing cover a cap around the region;
    those whose nearest regional points all lie on one side of them (an angular gap above 180 degrees) are outside.
    A point's distance to the nearest outside one, plus half a spacing, is its distance to the edge (inf: no edge,
    when the points reach within 18 degrees of the antipode of their centre and so cover the globe).

    Approximate where the region is concave (an outside point that regional points surround by more than 180
    degrees counts as inside) and on a grid whose spacing differs by direction (a lat/lon grid far from the
    equator): a spacing is the median nearest-neighbour distance, so rows along the wider direction count as more
    than one."""
    points = unit_vectors(latitudes, longitudes)
    spacing = spacing_km(points) / EARTH_RADIUS_KM  # radians
    centre = points.mean(axis=0)
    norm = np.linalg.norm(centre)
    centre = centre / norm if norm > 1e-9 else np.array([0.0, 0.0, 1.0])
    spread = float(np.arccos(np.clip(points @ centre, -1.0, 1.0)).max())
    if spread >= GLOBAL_SPREAD:
        return np.full(len(points), np.inf)
    radius = spread + _CAP_MARGIN_SPACINGS * spacing
    auxiliary = cap_lattice(centre, radius, spacing / AUXILIARY_DENSITY)
    outside = auxiliary[_outside(points, auxiliary)]
    if len(outside) == 0:
        return np.full(len(points), np.inf)
    distance, _ = nearest_km(outside, points)
    return distance + spacing * EARTH_RADIUS_KM / 2.0


def _outside(points: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """(Q,) bool: True where the nearest of (N, 3) ``points`` leave an angular gap above 180 degrees around each of
    (Q, 3) ``queries`` (seen in the plane tangent to the sphere there)."""
    _, nearest = cKDTree(points).query(queries, k=min(SURROUNDING_NEIGHBOURS, len(points)))
    return _angular_gap(queries, points[nearest.reshape(len(queries), -1)]) > np.pi + 1e-9


def _angular_gap(queries: np.ndarray, neighbours: np.ndarray) -> np.ndarray:
    """(Q,) widest angle (radians) between the directions from each of (Q, 3) ``queries`` to its (Q, k, 3)
    ``neighbours``, in the tangent plane."""
    helper = np.where(np.abs(queries[:, 2:3]) < 0.9, [[0.0, 0.0, 1.0]], [[1.0, 0.0, 0.0]])
    east = np.cross(helper, queries)
    east /= np.linalg.norm(east, axis=1, keepdims=True)
    north = np.cross(queries, east)
    angles = np.sort(np.arctan2(np.einsum("qkj,qj->qk", neighbours, north), np.einsum("qkj,qj->qk", neighbours, east)))
    return np.diff(angles, axis=1, append=angles[:, :1] + 2.0 * np.pi).max(axis=1)


def boundary_width_km(
    latitudes: np.ndarray, longitudes: np.ndarray, *, width_km: float | None, width_rows: int | None
) -> float:
    """The strip's width in km: ``width_km``, or ``width_rows`` x the regional spacing (median nearest-neighbour
    distance); exactly one of them is set."""
    if (width_km is None) == (width_rows is None):
        raise ValueError(f"set exactly one of width_km ({width_km}) and width_rows ({width_rows})")
    return float(width_km) if width_km is not None else width_rows * spacing_km(unit_vectors(latitudes, longitudes))


@dataclass(frozen=True, eq=False, kw_only=True)
class BoundaryZarr(DatasetView):
    """The regional store, with the values of its ``boundary`` points ((B,) int64, increasing;
    ``point_masks['boundary']``) replaced by the global ``source`` interpolated there (``interpolator``, one row
    per boundary point). Statistics, ``path`` and ``attrs`` (plus a ``boundary`` description) are the regional
    store's."""

    regional: AnemoiZarr
    source: AnemoiZarr
    boundary: np.ndarray
    interpolator: SphericalInterpolator

    def __repr__(self) -> str:
        return f"BoundaryZarr(boundary of {self.regional.path} from {self.source.path}, shape={self.shape})"

    def read(self, dates: slice, variables: np.ndarray, grid: slice = slice(None), ensemble: int = 0) -> np.ndarray:
        """Values of a date slice, (n_dates, len(variables), n_grid) float32; reads the global source only when
        ``grid`` reaches boundary points."""
        block = self.regional.read(dates, variables, grid, ensemble)
        points = np.arange(self.shape[-1])[grid]
        forced = np.flatnonzero(self.point_masks[BOUNDARY][points])  # positions in ``block``
        if forced.size == 0:
            return block
        rows = np.searchsorted(self.boundary, points[forced])
        indices = self.interpolator.indices[rows]
        low, high = int(indices.min()), int(indices.max()) + 1
        names = [self.variables[i] for i in np.asarray(variables)]
        values = self.source.read(dates, self.source.variable_indices(names), slice(low, high), ensemble)
        part = SphericalInterpolator(indices=indices - low, weights=self.interpolator.weights[rows])
        block[..., forced] = part.apply(values).astype(np.float32)
        return block


def open_boundary(
    regional: AnemoiZarr, source: AnemoiZarr, *, width_km: float | None, width_rows: int | None
) -> BoundaryZarr:
    """``regional`` with a boundary strip ``width_km`` wide (or ``width_rows`` regional spacings) forced by
    ``source`` (:func:`edge_distance_km`: a point is in the strip when its distance to the edge is at most the
    width). Raises ValueError naming both files when the stores differ in variables, dates, frequency or members,
    when a regional point lies outside the global grid, or when the strip is empty or leaves no interior point."""
    relation = f"boundary of {regional.path} from {source.path}"
    check_combinable(regional, source, relation=relation)
    check_surrounded(regional, source, relation=relation)
    width = boundary_width_km(regional.latitudes, regional.longitudes, width_km=width_km, width_rows=width_rows)
    distance = edge_distance_km(regional.latitudes, regional.longitudes)
    _check_strip(regional, distance, width, relation)
    boundary = np.flatnonzero(distance <= width).astype(np.int64)
    try:
        interpolator = spherical_interpolator(
            source.latitudes, source.longitudes, regional.latitudes[boundary], regional.longitudes[boundary]
        )
    except ValueError as error:
        raise ValueError(f"{relation}: {error}") from None
    mask = np.zeros(regional.shape[-1], dtype=bool)
    mask[boundary] = True
    description = {
        "regional": str(regional.path),
        "global": str(source.path),
        "width_km": width,
        "points": int(boundary.size),
    }
    return BoundaryZarr(
        path=regional.path,
        variables=list(regional.variables),
        frequency=regional.frequency,
        dates=regional.dates,
        latitudes=regional.latitudes,
        longitudes=regional.longitudes,
        statistics=regional.statistics,
        zarr_format=regional.zarr_format,
        shape=regional.shape,
        attrs={**regional.attrs, "boundary": description},
        point_masks={BOUNDARY: mask},
        regional=regional,
        source=source,
        boundary=boundary,
        interpolator=interpolator,
    )


def _check_strip(regional: AnemoiZarr, distance: np.ndarray, width: float, relation: str) -> None:
    """Refuse a strip of no point (the region has no edge, or the width is below the outer row's distance) or of
    every point (no interior left), naming the widths that work."""
    spacing = spacing_km(unit_vectors(regional.latitudes, regional.longitudes))
    if not np.isfinite(distance).any():
        raise ValueError(f"{relation}: {regional.path} covers the whole globe, so it has no edge to force")
    nearest, farthest = float(distance.min()), float(distance.max())
    if width < nearest:
        raise ValueError(
            f"{relation}: a boundary {width:.0f} km wide holds no point (the outermost points are {nearest:.0f} km "
            f"from the region's edge); choose width_km of at least {np.ceil(nearest):.0f} or width_rows of at least 1"
        )
    if width >= farthest:
        raise ValueError(
            f"{relation}: a boundary {width:.0f} km wide leaves no interior point (every point of {regional.path} is "
            f"within {farthest:.0f} km of the region's edge); choose width_km below {np.floor(farthest):.0f} or "
            f"width_rows below {farthest / spacing:.3g} (the regional spacing is {spacing:.0f} km)"
        )

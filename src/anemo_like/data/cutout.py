"""A regional dataset inset into a global one (anemoi-datasets' ``cutout``): one grid of the regional points
followed by the global points that lie outside the region, read lazily from both stores."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.spatial import cKDTree

from anemo_like.data.point_masks import REGION
from anemo_like.data.sphere import km_to_chord, spacing_km, unit_vectors
from anemo_like.data.views import DatasetView, check_combinable, check_surrounded, file_stamp, view_statistics
from anemo_like.data.zarr_store import AnemoiZarr


def cutout_keep(
    regional_latitudes: np.ndarray,
    regional_longitudes: np.ndarray,
    global_latitudes: np.ndarray,
    global_longitudes: np.ndarray,
    min_distance_km: float,
) -> np.ndarray:
    """(G_global,) bool: True on the global points (degrees) farther than ``min_distance_km`` (great circle) from
    every regional point (degrees), the ones a cut-out grid keeps."""
    tree = cKDTree(unit_vectors(regional_latitudes, regional_longitudes))
    chord, _ = tree.query(unit_vectors(global_latitudes, global_longitudes))
    return chord > km_to_chord(min_distance_km)


def default_min_distance_km(regional_latitudes: np.ndarray, regional_longitudes: np.ndarray) -> float:
    """The regional grid's spacing, km (median distance from a regional point to its nearest neighbour): global
    points within one regional spacing of a regional point fall inside the region and are dropped."""
    return spacing_km(unit_vectors(regional_latitudes, regional_longitudes))


@dataclass(frozen=True, eq=False, kw_only=True)
class CutoutZarr(DatasetView):
    """The combined grid: the regional store's points first (``point_masks['region']`` True), then the global
    store's points ``kept`` (indices into its grid, increasing). ``path`` is the regional store's path; variables
    are in the global store's order, which also gives ``attrs`` (plus a ``cutout`` description)."""

    regional: AnemoiZarr
    globe: AnemoiZarr
    kept: np.ndarray  # (K,) int64

    def __repr__(self) -> str:
        return f"CutoutZarr(cutout of {self.regional.path} into {self.globe.path}, shape={self.shape})"

    def read(self, dates: slice, variables: np.ndarray, grid: slice = slice(None), ensemble: int = 0) -> np.ndarray:
        """Values of a date slice, (n_dates, len(variables), n_grid) float32; reads only the store(s) ``grid``
        (a slice of the combined grid) reaches."""
        points = np.arange(self.shape[-1])[grid]
        names = [self.variables[i] for i in np.asarray(variables)]
        n_regional = self.regional.shape[-1]
        parts = []
        inner = points[points < n_regional]
        if inner.size:
            block = self.regional.read(
                dates, self.regional.variable_indices(names), slice(int(inner[0]), int(inner[-1]) + 1), ensemble
            )
            parts.append(block[..., inner - inner[0]])
        outer = self.kept[points[points >= n_regional] - n_regional]
        if outer.size:
            low, high = int(outer.min()), int(outer.max()) + 1
            block = self.globe.read(dates, self.globe.variable_indices(names), slice(low, high), ensemble)
            parts.append(block[..., outer - low])
        if not parts:
            return self.regional.read(dates, self.regional.variable_indices(names), slice(0, 0), ensemble)
        return np.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


def open_cutout(
    regional: AnemoiZarr, globe: AnemoiZarr, *, min_distance_km: float | None, cache: Path | None
) -> CutoutZarr:
    """``regional`` inset into ``globe``: global points closer than ``min_distance_km`` (None: the regional spacing,
    :func:`default_min_distance_km`) to a regional point are dropped. Statistics of the combined grid come from at
    most 64 evenly spaced dates (:func:`~anemo_like.data.views.view_statistics`, kept in ``cache``). Raises
    ValueError naming both files when the stores differ in variables, dates, frequency or members, when a regional
    point lies outside the global grid, or when no global point is left."""
    relation = f"cutout of {regional.path} into {globe.path}"
    check_combinable(globe, regional, relation=relation)
    check_surrounded(regional, globe, relation=relation)
    if min_distance_km is None:
        min_distance_km = default_min_distance_km(regional.latitudes, regional.longitudes)
    keep = cutout_keep(regional.latitudes, regional.longitudes, globe.latitudes, globe.longitudes, min_distance_km)
    if not keep.any():
        raise ValueError(
            f"{relation}: no global point is farther than min_distance_km {min_distance_km:g} from the region, so "
            "nothing of the global dataset is left; lower min_distance_km or use a global dataset"
        )
    kept = np.flatnonzero(keep).astype(np.int64)
    n_regional, n_grid = regional.shape[-1], regional.shape[-1] + kept.size
    region = np.zeros(n_grid, dtype=bool)
    region[:n_regional] = True
    description = {
        "regional": str(regional.path),
        "global": str(globe.path),
        "min_distance_km": float(min_distance_km),
        "regional_points": n_regional,
        "global_points_kept": int(kept.size),
    }
    view = CutoutZarr(
        path=regional.path,
        variables=list(globe.variables),
        frequency=globe.frequency,
        dates=globe.dates,
        latitudes=np.concatenate([regional.latitudes, globe.latitudes[kept]]),
        longitudes=np.concatenate([regional.longitudes, globe.longitudes[kept]]),
        statistics={},
        zarr_format=regional.zarr_format,
        shape=(*globe.shape[:3], n_grid),
        attrs={**globe.attrs, "shape": [*globe.shape[:3], n_grid], "cutout": description},
        point_masks={REGION: region},
        regional=regional,
        globe=globe,
        kept=kept,
    )
    settings = {"cutout": description, "files": [file_stamp(regional.path), file_stamp(globe.path)]}
    view.statistics.update(view_statistics(view, cache=cache, settings=settings))
    return view

"""Datasets computed on read from two anemoi-datasets zarr stores (a cut-out grid, a limited-area grid with forced
boundary values): the common base, the checks that two stores can be combined, and their combined statistics."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from anemo_like.data.sphere import nearest_km, spacing_km, unit_vectors
from anemo_like.data.zarr_store import STATISTICS, AnemoiZarr, format_frequency

SURROUND_FACTOR = 2.0  # a regional point farther than this x the global spacing from every global point is outside
STATISTICS_DATES = 64  # a view's statistics come from at most this many evenly spaced dates


@dataclass(frozen=True, eq=False, kw_only=True)
class DatasetView(AnemoiZarr):
    """An :class:`AnemoiZarr` whose values are computed from other stores by ``read``; it has no ``data`` array.

    ``point_masks`` holds its per-point masks ((n_grid,) bool by name, see :mod:`anemo_like.data.point_masks`)."""

    point_masks: dict[str, np.ndarray] = field(repr=False)

    @property
    def data(self) -> Any:
        raise TypeError(f"{self!r} is computed on read and has no 'data' array; use read()")


def check_combinable(main: AnemoiZarr, other: AnemoiZarr, *, relation: str) -> None:
    """Raise ValueError naming both files when ``other`` lacks or adds variables, or differs in frequency, dates or
    ensemble members (``relation`` names the pair, e.g. 'cutout of A into B')."""
    missing, extra = (
        sorted(set(main.variables) - set(other.variables)),
        sorted(set(other.variables) - set(main.variables)),
    )
    if missing or extra:
        changes = ([f"lacks {', '.join(missing)}"] if missing else []) + ([f"adds {', '.join(extra)}"] if extra else [])
        raise ValueError(
            f"{relation}: the variables differ ({other.path} {' and '.join(changes)} compared with {main.path}); "
            "both datasets need the same variables"
        )
    if main.frequency != other.frequency:
        raise ValueError(
            f"{relation}: the frequencies differ ({main.path}: {format_frequency(main.frequency)}, {other.path}: "
            f"{format_frequency(other.frequency)}); both datasets need the same dates"
        )
    if len(main.dates) != len(other.dates) or (main.dates != other.dates).any():
        _refuse_dates(main, other, relation)
    if main.shape[2] != other.shape[2]:
        raise ValueError(
            f"{relation}: {main.path} has {main.shape[2]} ensemble member(s), {other.path} {other.shape[2]}; "
            "both datasets need the same members"
        )


def _refuse_dates(main: AnemoiZarr, other: AnemoiZarr, relation: str) -> None:
    shared = min(len(main.dates), len(other.dates))
    differ = np.flatnonzero(main.dates[:shared] != other.dates[:shared])
    first = int(differ[0]) if differ.size else shared

    def at(store: AnemoiZarr) -> str:
        return str(store.dates[first]) if first < len(store.dates) else "no date (it ends before)"

    raise ValueError(
        f"{relation}: the dates differ ({main.path}: {main.dates[0]} .. {main.dates[-1]}, {other.path}: "
        f"{other.dates[0]} .. {other.dates[-1]}); date {first} is {at(main)} in {main.path} and {at(other)} in "
        f"{other.path}; both datasets need the same dates"
    )


def check_surrounded(regional: AnemoiZarr, globe: AnemoiZarr, *, relation: str) -> None:
    """Raise ValueError when a regional point lies outside the global dataset: its nearest global point is farther
    than :data:`SURROUND_FACTOR` x the global grid's spacing (median nearest-neighbour distance)."""
    points = unit_vectors(globe.latitudes, globe.longitudes)
    limit = SURROUND_FACTOR * spacing_km(points)
    distance, _ = nearest_km(points, unit_vectors(regional.latitudes, regional.longitudes))
    outside = np.flatnonzero(distance > limit)
    if outside.size:
        worst = int(outside[np.argmax(distance[outside])])
        raise ValueError(
            f"{relation}: {outside.size} of the {len(distance)} points of {regional.path} lie outside {globe.path}, "
            f"e.g. ({regional.latitudes[worst]:g}, {regional.longitudes[worst]:g}) is {distance[worst]:.0f} km from "
            f"its nearest global point (more than {SURROUND_FACTOR:g} x the global spacing, {limit:.0f} km); the "
            "global dataset must cover the region"
        )


def view_statistics(view: AnemoiZarr, *, cache: Path | None, settings: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per-variable mean, stdev, minimum and maximum (V,) float64 of ``view`` over its whole grid and members, from
    at most :data:`STATISTICS_DATES` evenly spaced dates (non-finite values left out); kept as JSON in the folder
    ``cache`` (None: recomputed), keyed by a hash of ``settings`` (the input files and their modification times
    belong there)."""
    file = None
    if cache is not None:
        key = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]
        file = cache / "views" / f"statistics-{key}.json"
        if file.is_file():
            stored = json.loads(file.read_text())
            return {name: np.array(stored[name], dtype=np.float64) for name in STATISTICS}
    statistics = _sampled_statistics(view)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({name: values.tolist() for name, values in statistics.items()}))
        os.replace(tmp, file)
    return statistics


def _sampled_statistics(view: AnemoiZarr) -> dict[str, np.ndarray]:
    n_dates, n_vars, n_members, _ = view.shape
    dates = np.unique(np.linspace(0, n_dates - 1, min(STATISTICS_DATES, n_dates)).round().astype(np.int64))
    variables = np.arange(n_vars)
    total, squares, count = np.zeros(n_vars), np.zeros(n_vars), np.zeros(n_vars)
    low, high = np.full(n_vars, np.inf), np.full(n_vars, -np.inf)
    for date in dates:
        for member in range(n_members):
            values = view.read(slice(date, date + 1), variables, ensemble=member)[0].astype(np.float64)  # (V, G)
            ok = np.isfinite(values)
            clean = np.where(ok, values, 0.0)
            total, squares, count = total + clean.sum(1), squares + (clean**2).sum(1), count + ok.sum(1)
            low = np.minimum(low, np.where(ok, values, np.inf).min(1))
            high = np.maximum(high, np.where(ok, values, -np.inf).max(1))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        stdev = np.sqrt(np.maximum(squares / count - mean**2, 0.0))
    none = count == 0
    low[none], high[none] = np.nan, np.nan
    return {"mean": mean, "stdev": stdev, "minimum": low, "maximum": high}


def file_stamp(path: Path) -> tuple[str, int]:
    """(resolved path, modification time in ns) of a dataset folder: part of a cache key."""
    return str(Path(path).resolve()), os.stat(path).st_mtime_ns

"""Read anemoi-datasets zarr archives natively with ``zarr`` (format v2 and v3); writing is in
:mod:`~anemo_like.data.zarr_writer`.

Layout: a zarr group with array ``data`` of shape (dates, variables, ensembles, grid) float32, one date per chunk;
group attributes ``variables``, ``frequency``, ``start_date``, ``end_date``; arrays ``dates`` (datetime64[s]),
``latitudes``/``longitudes`` (degrees, (grid,)) and per-variable statistics ``mean``, ``stdev``, ``minimum``,
``maximum`` ((variables,)).
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from anemo_like.data import zarr_exit  # noqa: F401  (a clean exit after zarr reads: its module docstring)
from anemo_like.data.zarr_errors import (
    CorruptDatasetError,  # noqa: F401  (raised by the helpers; callers import it from here)
    check_data_chunks,
    check_unique_variables,
    chunks_of,
    dataset_folder,
    describe_data_chunk,
    find_undecodable_chunk,
    open_array,
    open_group,
    read_whole,
)

STATISTICS = ("mean", "stdev", "minimum", "maximum")
_FREQUENCY = re.compile(r"^\s*(\d+)\s*(s|m|min|h|d)\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_frequency(value: str | int, *, source: str = "frequency") -> datetime.timedelta:
    """'6h', '30m'/'30min', '1d', '90s' or an int number of hours (old datasets) -> timedelta."""
    if isinstance(value, int | np.integer) and not isinstance(value, bool):
        hours = int(value)
        if hours <= 0:
            raise ValueError(f"{source}: frequency must be positive, got {value!r}")
        return datetime.timedelta(hours=hours)
    match = _FREQUENCY.match(str(value))
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"{source}: cannot parse frequency {value!r}; expected e.g. '6h', '30m', '1d' or int hours")
    return datetime.timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()])


def format_frequency(delta: datetime.timedelta) -> str:
    """timedelta -> the shortest anemoi-style string: '1d', '6h', '30m' or '90s'."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True, eq=False)
class AnemoiZarr:
    """Metadata of an opened anemoi-datasets zarr; ``data`` is opened lazily on first read and never pickled."""

    path: Path
    variables: list[str]
    frequency: datetime.timedelta
    dates: np.ndarray  # datetime64[s], (n_dates,)
    latitudes: np.ndarray  # float64 degrees, (n_grid,)
    longitudes: np.ndarray  # float64 degrees, (n_grid,)
    statistics: dict[str, np.ndarray]  # mean/stdev/minimum/maximum, float64 (n_variables,)
    zarr_format: int
    shape: tuple[int, int, int, int]  # (n_dates, n_variables, n_ensembles, n_grid)
    attrs: dict[str, Any] = field(repr=False)  # all group attributes
    _handle: tuple[int, zarr.Array] | None = field(default=None, init=False, repr=False)  # (process id, data)

    def __repr__(self) -> str:
        return (
            f"AnemoiZarr({str(self.path)!r}, shape={self.shape}, dates={self.dates[0]}..{self.dates[-1]}, "
            f"frequency={format_frequency(self.frequency)}, variables={self.variables}, zarr_format={self.zarr_format})"
        )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_handle"] = None  # each process opens its own handle
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def data(self) -> zarr.Array:
        """The ``data`` array (dates, variables, ensembles, grid), opened lazily once per process (also after fork)."""
        if self._handle is None or self._handle[0] != os.getpid():
            object.__setattr__(self, "_handle", (os.getpid(), zarr.open_group(self.path, mode="r")["data"]))
        return self._handle[1]

    def variable_indices(self, names: Sequence[str]) -> np.ndarray:
        """Indices of ``names`` in ``variables``, in the requested order, (len(names),) int64."""
        position = {name: i for i, name in enumerate(self.variables)}
        unknown = [name for name in names if name not in position]
        if unknown:
            hints = []
            for name in unknown:
                close = difflib.get_close_matches(name, self.variables, n=1)
                hints.append(f"'{name}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
            raise ValueError(
                f"{self.path}: unknown variable(s) {', '.join(hints)}; available: {', '.join(self.variables)}"
            )
        return np.array([position[name] for name in names], dtype=np.int64)

    def date_range(self, start: str | np.datetime64 | None, end: str | np.datetime64 | None) -> tuple[int, int]:
        """(start index inclusive, stop index exclusive) of the dates in the inclusive window [start, end].

        ``end`` is inclusive at its own precision: '2000-03' ends with the last date of March 2000. ``None`` means the
        dataset's first (start) or last (end) date. Raises ValueError if the window reaches outside the dataset.
        """
        first, last = self.dates[0], self.dates[-1]
        lo = self._parse_date(start) if start is not None else first
        hi = self._parse_date(end) if end is not None else last
        if not (first <= lo <= last and first <= hi <= last):
            raise ValueError(
                f"{self.path}: date window {lo} .. {hi} is outside the dataset, which covers {first} .. {last}"
            )
        start_index = int(np.searchsorted(self.dates, lo, side="left"))
        stop_index = int(np.searchsorted(self.dates, hi + 1, side="left")) if end is not None else len(self.dates)
        if start_index >= stop_index:
            raise ValueError(f"{self.path}: date window {lo} .. {hi} contains no dates (start is after end)")
        return start_index, stop_index

    def _parse_date(self, value: str | np.datetime64) -> np.datetime64:
        try:
            return np.datetime64(value)
        except ValueError as error:
            raise ValueError(
                f"{self.path}: cannot parse date {value!r}; expected ISO 8601 like 2000-01-31T18"
            ) from error

    def read(self, dates: slice, variables: np.ndarray, grid: slice = slice(None), ensemble: int = 0) -> np.ndarray:
        """Values of a date slice (a step is allowed), (n_dates, len(variables), n_grid) float32.

        Reads the dates' whole chunks once, then takes the variables: 1.5-2x faster than zarr orthogonal indexing
        on the shared HS dataset (all variables of a date share one chunk).
        """
        try:
            block = self.data[dates, :, ensemble, grid]
        except IndexError:  # a selection outside the array, not a damaged file
            raise
        except Exception as error:  # a damaged chunk: find it (only now) and name its file, dates and variables
            chunks = chunks_of(self.shape, self.data.chunks, (dates, slice(None), ensemble, grid))
            corrupt = find_undecodable_chunk(self.data, self.path, chunks, self.describe_chunk)
            if corrupt is None:
                raise
            raise corrupt from error
        return np.take(block, np.asarray(variables), axis=1)

    def describe_chunk(self, coords: tuple[int, ...]) -> str:
        """The dates and variables chunk ``coords`` of ``data`` holds."""
        return describe_data_chunk(coords, self.data.chunks, self.dates, self.variables)


def dataset_key_error(path: Path, key: str, expected: str) -> ValueError:
    """The error for dataset key ``key`` of ``path``: what it is, then what was expected."""
    return ValueError(f"{path}: '{key}' {expected}")


def _read_small(group: zarr.Group, path: Path, key: str, length: int, dtype: str) -> np.ndarray:
    array = open_array(group, path, key)
    if array is None:
        raise dataset_key_error(path, key, f"array is missing; expected shape ({length},)")
    values = read_whole(array, path)
    if values.shape != (length,):
        raise dataset_key_error(path, key, f"has shape {values.shape}; expected ({length},)")
    return values.astype(dtype)


def read_tendency_stdev(store: AnemoiZarr, step: datetime.timedelta) -> np.ndarray | None:
    """The dataset's ``statistics_tendencies_<step>_stdev`` (V,) in physical units (anemoi-datasets writes them);
    None when it has none (a cut-out grid's come from no file), an error naming the array when its shape is not one
    value per variable."""
    if "cutout" in store.attrs:
        return None
    key = f"statistics_tendencies_{format_frequency(step)}_stdev"
    group = open_group(store.path)
    if open_array(group, store.path, key) is None:
        return None
    return _read_small(group, store.path, key, len(store.variables), "float64")


def check_dates(path: Path, dates: np.ndarray, frequency: datetime.timedelta) -> None:
    """``dates`` must be non-empty and step by ``frequency`` without gaps."""
    if len(dates) == 0:
        raise dataset_key_error(path, "dates", "is empty; expected at least one date")
    steps = np.diff(dates).astype("timedelta64[s]").astype(np.int64)
    bad = np.flatnonzero(steps != int(frequency.total_seconds()))
    if bad.size:
        i = int(bad[0])
        raise dataset_key_error(
            path,
            "dates",
            f"must increase by the frequency {format_frequency(frequency)} without gaps; "
            f"found {dates[i]} followed by {dates[i + 1]}",
        )


def _check_coordinates(path: Path, latitudes: np.ndarray, longitudes: np.ndarray) -> None:
    """Grid coordinates must be finite degrees, latitudes within [-90, 90]."""
    for key, values in (("latitudes", latitudes), ("longitudes", longitudes)):
        if not np.isfinite(values).all():
            raise dataset_key_error(
                path, key, f"holds {int((~np.isfinite(values)).sum())} NaN or inf values; expected degrees"
            )
    if np.abs(latitudes).max(initial=0.0) > 90.0:
        raise dataset_key_error(
            path, "latitudes", f"reach {np.abs(latitudes).max():g}; expected degrees within [-90, 90]"
        )


def open_anemoi_zarr(path: str | Path) -> AnemoiZarr:
    """Open the metadata of an anemoi-datasets zarr (v2 or v3) without reading ``data``.

    Damaged files (metadata, chunks of the small arrays, missing chunk files of ``data``) raise
    :class:`CorruptDatasetError` naming the file.
    """
    path = dataset_folder(path)
    group = open_group(path)
    attrs = dict(group.attrs)
    for key in ("variables", "frequency"):
        if key not in attrs:
            raise dataset_key_error(path, key, "group attribute is missing")
    data = open_array(group, path, "data")
    if data is None:
        raise dataset_key_error(path, "data", "array is missing; expected (dates, variables, ensembles, grid) float32")
    if data.ndim != 4:
        raise dataset_key_error(
            path, "data", f"has shape {data.shape}; expected 4 dims (dates, variables, ensembles, grid)"
        )
    n_dates, n_vars, _, n_grid = data.shape
    variables = [str(name) for name in attrs["variables"]]
    if len(variables) != n_vars:
        raise dataset_key_error(path, "variables", f"lists {len(variables)} names but 'data' has {n_vars} variables")
    check_unique_variables(path, variables)
    frequency = parse_frequency(attrs["frequency"], source=f"{path}: 'frequency'")
    dates = _read_small(group, path, "dates", n_dates, "datetime64[s]")
    check_dates(path, dates, frequency)
    check_data_chunks(path, data, dates, variables, attrs)
    latitudes = _read_small(group, path, "latitudes", n_grid, "float64")
    longitudes = _read_small(group, path, "longitudes", n_grid, "float64")
    _check_coordinates(path, latitudes, longitudes)
    return AnemoiZarr(
        path=path,
        variables=variables,
        frequency=frequency,
        dates=dates,
        latitudes=latitudes,
        longitudes=longitudes,
        statistics={key: _read_small(group, path, key, n_vars, "float64") for key in STATISTICS},
        zarr_format=int(group.metadata.zarr_format),
        shape=tuple(int(n) for n in data.shape),
        attrs=attrs,
    )

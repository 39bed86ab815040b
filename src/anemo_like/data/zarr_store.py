"""Read and write anemoi-datasets zarr archives natively with ``zarr`` (format v2 and v3).

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
import shutil
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numcodecs
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


def _fail(path: Path, key: str, expected: str) -> ValueError:
    return ValueError(f"{path}: '{key}' {expected}")


def _read_small(group: zarr.Group, path: Path, key: str, length: int, dtype: str) -> np.ndarray:
    array = open_array(group, path, key)
    if array is None:
        raise _fail(path, key, f"array is missing; expected shape ({length},)")
    values = read_whole(array, path)
    if values.shape != (length,):
        raise _fail(path, key, f"has shape {values.shape}; expected ({length},)")
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


def _check_dates(path: Path, dates: np.ndarray, frequency: datetime.timedelta) -> None:
    if len(dates) == 0:
        raise _fail(path, "dates", "is empty; expected at least one date")
    steps = np.diff(dates).astype("timedelta64[s]").astype(np.int64)
    bad = np.flatnonzero(steps != int(frequency.total_seconds()))
    if bad.size:
        i = int(bad[0])
        raise _fail(
            path,
            "dates",
            f"must increase by the frequency {format_frequency(frequency)} without gaps; "
            f"found {dates[i]} followed by {dates[i + 1]}",
        )


def _check_coordinates(path: Path, latitudes: np.ndarray, longitudes: np.ndarray) -> None:
    """Grid coordinates must be finite degrees, latitudes within [-90, 90]."""
    for key, values in (("latitudes", latitudes), ("longitudes", longitudes)):
        if not np.isfinite(values).all():
            raise _fail(path, key, f"holds {int((~np.isfinite(values)).sum())} NaN or inf values; expected degrees")
    if np.abs(latitudes).max(initial=0.0) > 90.0:
        raise _fail(path, "latitudes", f"reach {np.abs(latitudes).max():g}; expected degrees within [-90, 90]")


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
            raise _fail(path, key, "group attribute is missing")
    data = open_array(group, path, "data")
    if data is None:
        raise _fail(path, "data", "array is missing; expected (dates, variables, ensembles, grid) float32")
    if data.ndim != 4:
        raise _fail(path, "data", f"has shape {data.shape}; expected 4 dims (dates, variables, ensembles, grid)")
    n_dates, n_vars, _, n_grid = data.shape
    variables = [str(name) for name in attrs["variables"]]
    if len(variables) != n_vars:
        raise _fail(path, "variables", f"lists {len(variables)} names but 'data' has {n_vars} variables")
    check_unique_variables(path, variables)
    frequency = parse_frequency(attrs["frequency"], source=f"{path}: 'frequency'")
    dates = _read_small(group, path, "dates", n_dates, "datetime64[s]")
    _check_dates(path, dates, frequency)
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


def compute_statistics(data: np.ndarray) -> dict[str, np.ndarray]:
    """Per-variable mean, stdev, minimum, maximum over dates, ensembles and grid of (dates, vars, ens, grid) data.

    Non-finite values (missing data) are left out; a variable with no finite value gets NaN statistics.
    """
    stats: dict[str, list[float]] = {key: [] for key in STATISTICS}
    for variable in range(data.shape[1]):
        values = np.asarray(data[:, variable], dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            values = np.array([np.nan])
        stats["mean"].append(values.mean())
        stats["stdev"].append(values.std())
        stats["minimum"].append(values.min())
        stats["maximum"].append(values.max())
    return {key: np.array(values, dtype=np.float64) for key, values in stats.items()}


def _compressors(zarr_format: int) -> Any:
    """Blosc zstd with byte shuffle in both formats: float32 fields compress ~2x better than without shuffle."""
    if zarr_format == 2:
        return numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    return zarr.codecs.BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")


def _check_layout(
    path: Path, data: np.ndarray, variables: list[str], dates: np.ndarray, grid_lengths: tuple[int, int]
) -> None:
    """Raise ValueError naming the key when ``data`` is not 4-D or an axis length disagrees with its labels."""
    if data.ndim != 4:
        raise _fail(path, "data", f"has shape {data.shape}; expected 4 dims (dates, variables, ensembles, grid)")
    n_dates, n_vars, _, n_grid = data.shape
    expected = {
        "variables": (len(variables), n_vars),
        "dates": (len(dates), n_dates),
        "latitudes": (grid_lengths[0], n_grid),
        "longitudes": (grid_lengths[1], n_grid),
    }
    for key, (got, want) in expected.items():
        if got != want:
            raise _fail(path, key, f"has length {got}; expected {want} to match 'data' of shape {data.shape}")
    check_unique_variables(path, variables)


def _group_attributes(
    variables: list[str], dates: np.ndarray, step: datetime.timedelta, shape: tuple[int, ...], attrs: dict[str, Any]
) -> dict[str, Any]:
    """The anemoi-datasets group attributes of a store, updated with ``attrs``."""
    return {
        "variables": variables,
        "frequency": format_frequency(step),
        "start_date": str(dates[0]),
        "end_date": str(dates[-1]),
        "dimensions": ["dates", "variables", "ensembles", "values"],
        "shape": list(shape),
        "dtype": "float32",
        "missing_dates": [],
        "statistics_start_date": str(dates[0]),
        "statistics_end_date": str(dates[-1]),
        **attrs,
    }


def _write_group(
    path: Path, *, data: np.ndarray, small: dict[str, np.ndarray], attrs: dict[str, Any], zarr_format: int
) -> None:
    """Create the zarr group at ``path``: ``data`` one date per chunk, then each array of ``small`` whole."""
    _, n_vars, n_ens, n_grid = data.shape
    group = zarr.open_group(path, mode="w-", zarr_format=zarr_format)
    group.attrs.update(attrs)
    array = group.create_array(
        "data",
        shape=data.shape,
        chunks=(1, n_vars, n_ens, n_grid),
        dtype="float32",
        compressors=_compressors(zarr_format),
        fill_value=np.nan,
        # flat chunk files in both formats: v3's default "c/0/0/0/0" makes a folder per date
        chunk_key_encoding={"name": "v2" if zarr_format == 2 else "default", "separator": "."},
        config={"write_empty_chunks": True},  # every chunk has a file: a missing one is damage (see open_anemoi_zarr)
    )
    array[...] = data
    for key, values in small.items():
        group.create_array(key, data=values, compressors=_compressors(zarr_format))


def write_anemoi_zarr(
    path: str | Path,
    *,
    data: np.ndarray,
    variables: Sequence[str],
    dates: np.ndarray,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    frequency: str,
    zarr_format: int = 2,
    attrs: dict[str, Any] | None = None,
) -> Path:
    """Write an anemoi-datasets style zarr at ``path`` (must not exist) and return its resolved path.

    ``data`` is (dates, variables, ensembles, grid) and is stored as float32, one date per chunk; statistics are
    computed over all dates. The store is built in a sibling temporary directory and renamed into place, so a crash
    never leaves a partial dataset at ``path``.
    """
    path = Path(path).expanduser().resolve()
    if path.exists():
        raise FileExistsError(f"{path}: already exists; remove it first or choose another path")
    if zarr_format not in (2, 3):
        raise ValueError(f"{path}: zarr_format must be 2 or 3, got {zarr_format}")
    data = np.asarray(data, dtype=np.float32)
    dates = np.asarray(dates, dtype="datetime64[s]")
    variables = [str(name) for name in variables]
    step = parse_frequency(frequency)
    _check_layout(path, data, variables, dates, (len(latitudes), len(longitudes)))
    _check_dates(path, dates, step)
    small = {
        "dates": dates,
        "latitudes": np.asarray(latitudes, dtype=np.float64),
        "longitudes": np.asarray(longitudes, dtype=np.float64),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        _write_group(
            tmp,
            data=data,
            small={**small, **compute_statistics(data)},
            attrs=_group_attributes(variables, dates, step, data.shape, attrs or {}),
            zarr_format=zarr_format,
        )
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path

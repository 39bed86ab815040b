"""Initial states from GRIB or netCDF files (``input=``): read, merged and checked into one :class:`FileStates`.

Every file must hold every input variable of the model (its prognostic variables and forcings) at each of its times,
on the model's grid; the forcings of the grid (cos/sin of latitude and longitude) that the files lack are computed
from the files' coordinates, as anemoi-datasets computes them. Computed forcings (julian day, local time) are filled
by the forecast inputs as in training.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from anemo_like.config.inference import InferenceConfig, MarsKeys
from anemo_like.data.zarr_store import format_frequency
from anemo_like.inference.grib_reader import read_grib
from anemo_like.inference.mars_keys import load_eccodes, resolve_mars_keys
from anemo_like.inference.netcdf_reader import read_netcdf
from anemo_like.inference.state_source import FieldsRead, FileStates
from anemo_like.inference.units import to_model_units, usual_unit

GRID_FORCINGS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "cos_latitude": lambda lat, lon: np.cos(np.deg2rad(lat)),
    "sin_latitude": lambda lat, lon: np.sin(np.deg2rad(lat)),
    "cos_longitude": lambda lat, lon: np.cos(np.deg2rad(lon)),
    "sin_longitude": lambda lat, lon: np.sin(np.deg2rad(lon)),
}


def input_paths(config: InferenceConfig) -> list[Path]:
    """The files of ``input``, absolute; FileNotFoundError naming every one that is not a file."""
    paths = [
        Path(p).expanduser().absolute() for p in ([config.input] if isinstance(config.input, str) else config.input)
    ]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"input file(s) {', '.join(missing)}: no such file")
    return paths


def _label(paths: Sequence[Path]) -> str:
    return f"input {paths[0]}" if len(paths) == 1 else f"input files {', '.join(map(str, paths))}"


def _read(
    paths: list[Path], names: list[str], *, table: Mapping[str, MarsKeys], metadata: Sequence[tuple[str, Mapping]]
) -> list[FieldsRead]:
    """Each file's fields of ``names``: GRIB by MARS keys (resolved once, ecCodes checked first), netCDF by name."""
    grib = [path for path in paths if path.suffix.lower() != ".nc"]
    keys: dict[str, MarsKeys] = {}
    if grib:
        load_eccodes(f"input {grib[0]}")
        keys = resolve_mars_keys([n for n in names if n not in GRID_FORCINGS], table=table, metadata=metadata)
    return [read_netcdf(path, names) if path.suffix.lower() == ".nc" else read_grib(path, keys) for path in paths]


def _in_model_units(read: FieldsRead, attrs: Mapping[str, Any]) -> FieldsRead:
    """``read`` with each field in the unit the model was trained in (the dataset's ``variables_metadata``, else the
    parameter's usual unit); a field whose file states no unit is kept as it is."""
    stored = attrs.get("variables_metadata") or {}
    for (name, time), values in read.fields.items():
        target = (stored.get(name) or {}).get("units") or usual_unit(name)
        read.fields[name, time] = to_model_units(values, name, read.units.get(name), target, f"input {read.path}")
    return read


def _merge(files: list[FieldsRead]) -> tuple[dict[tuple[str, np.datetime64], np.ndarray], FieldsRead]:
    """Every file's fields in one mapping, and the first file with fields (its grid); ValueError on a field held
    twice or on files of different grids."""
    merged: dict[tuple[str, np.datetime64], np.ndarray] = {}
    where: dict[tuple[str, np.datetime64], Path] = {}
    with_fields = [f for f in files if f.fields]
    for read in with_fields:
        first = with_fields[0]
        if read.latitudes.shape != first.latitudes.shape or not np.array_equal(
            np.stack([read.latitudes, read.longitudes]), np.stack([first.latitudes, first.longitudes])
        ):
            raise ValueError(
                f"input {read.path} is on another grid than input {first.path} ({read.latitudes.size} and "
                f"{first.latitudes.size} points); give every file on the model's grid"
            )
        for key, values in read.fields.items():
            if key in merged:
                raise ValueError(f"input {read.path} and {where[key]} both hold {key[0]} at {key[1]}; keep one")
            merged[key], where[key] = values, read.path
    return merged, (with_fields[0] if with_fields else files[0])


def _check_variables(label: str, fields: Mapping, names: list[str], times: np.ndarray, labels: Mapping) -> None:
    """ValueError naming every variable of ``names`` missing at some time, in one line."""
    lacking = []
    for name in names:
        absent = [str(time) for time in times if (name, time) not in fields]
        if absent or not times.size:
            described = f"{name} ({labels[name]})" if name in labels else name
            partial = f" at {', '.join(absent)}" if absent and len(absent) < times.size else ""
            lacking.append(described + partial)
    if lacking:
        raise ValueError(
            f"{label} lacks {'; '.join(lacking)}; it must hold every input variable of the model at each of its "
            f"times: {', '.join(names)}"
        )


def _time_axis(times: np.ndarray, step: datetime.timedelta) -> tuple[np.ndarray, datetime.timedelta, np.ndarray]:
    """(dates, frequency, present): the regular axis over ``times`` (sorted, unique) whose frequency divides
    ``step`` and every gap between them, and which of its dates are ``times``."""
    seconds = math.gcd(int(step.total_seconds()), *np.diff(times).astype(np.int64).tolist())
    dates = np.arange(times[0], times[-1] + np.timedelta64(1, "s"), np.timedelta64(seconds, "s"))
    return dates, datetime.timedelta(seconds=seconds), np.isin(dates, times)


def read_state_files(
    config: InferenceConfig,
    *,
    names: list[str],
    step: datetime.timedelta,
    metadata: Sequence[tuple[str, Mapping[str, Mapping[str, Any]]]],
    attrs: dict[str, Any],
) -> FileStates:
    """The states of ``names`` (the model's prognostic variables and forcings) in the files of ``config.input``.

    ``metadata``: (source, variables_metadata) pairs for the MARS keys of GRIB files, after ``config.grib.variables``;
    ``attrs``: the dataset attributes the forecast reads (constant_fields, variables_metadata).
    """
    paths = input_paths(config)
    label = _label(paths)
    files = [
        _in_model_units(read, attrs) for read in _read(paths, names, table=config.grib.variables, metadata=metadata)
    ]
    merged, grid = _merge(files)
    times = np.unique(np.array([time for _, time in merged], dtype="datetime64[s]"))
    labels = {name: text for read in files for name, text in read.labels.items()}
    _check_variables(label, merged, [n for n in names if n not in GRID_FORCINGS], times, labels)
    dates, frequency, present = _time_axis(times, step)
    values = np.empty((len(times), len(names), grid.latitudes.size), np.float32)
    for v, name in enumerate(names):
        for t, time in enumerate(times):
            held = merged.get((name, time))
            values[t, v] = held if held is not None else GRID_FORCINGS[name](grid.latitudes, grid.longitudes)
    return FileStates(
        path=paths[0],
        files=tuple(paths),
        label=label,
        variables=list(names),
        frequency=frequency,
        dates=dates,
        present=present,
        values=values,
        latitudes=grid.latitudes,
        longitudes=grid.longitudes,
        attrs=attrs,
    )


def _times_held(store: FileStates) -> str:
    times = store.dates[store.present]
    return f"only {times[0]}" if len(times) == 1 else f"{len(times)} times from {times[0]} to {times[-1]}"


def file_initial_indices(
    requested: np.ndarray | None,
    store: FileStates,
    *,
    step: datetime.timedelta,
    multistep: int,
    steps: int,
    varying: bool,
) -> np.ndarray:
    """Indices (N,) in ``store.dates`` of the initial dates ``requested`` (N,) datetime64[s], each a time in the files
    with its ``multistep - 1`` input states ``step`` before; with forcings that change in time (``varying``), the
    files must also hold every later step up to their last time. None: the last time in the files with its input
    history. One ValueError names every missing time."""
    seconds = set(store.dates[store.present].astype(np.int64).tolist())

    def held(time: np.datetime64) -> bool:
        return int(time.astype(np.int64)) in seconds

    delta = np.timedelta64(int(step.total_seconds()), "s")
    if requested is None:
        complete = [d for d in store.dates[store.present] if all(held(d - k * delta) for k in range(multistep))]
        if not complete:
            raise ValueError(
                f"{store.label} has no time with the input history the model needs ({multistep} states "
                f"{format_frequency(step)} apart); it holds {_times_held(store)}"
            )
        requested = np.array([complete[-1]], dtype="datetime64[s]")
    missing: dict[np.datetime64, str] = {}
    for date in requested:
        leads = [date + k * delta for k in range(1, steps)] if varying else []
        needed = [
            *((date - k * delta, f"input state of {date}") for k in range(multistep - 1, 0, -1)),
            (date, "initial date"),
            *((time, f"forcings of the forecast from {date}") for time in leads if time <= store.dates[-1]),
        ]
        missing.update((time, why) for time, why in needed if not held(time) and time not in missing)
    if missing:
        raise ValueError(
            f"{store.label} lacks the time(s) {', '.join(f'{t} ({why})' for t, why in missing.items())}: the model "
            f"starts from {multistep} states {format_frequency(step)} apart; the files hold {_times_held(store)}"
        )
    return np.searchsorted(store.dates, requested).astype(np.int64)

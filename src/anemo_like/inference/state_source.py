"""What a forecast reads its initial states from: an anemoi-datasets zarr, or states read from GRIB/netCDF files.

:class:`StateSource` is the part of :class:`~anemo_like.data.zarr_store.AnemoiZarr` that the forecast inputs use;
:class:`FileStates` holds states read from files in memory behind the same interface.
"""

from __future__ import annotations

import datetime
import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


class StateSource(Protocol):
    """States on a regular time axis: (dates, variables, ensembles, grid) float32, physical units."""

    path: Path
    variables: list[str]
    frequency: datetime.timedelta
    dates: np.ndarray  # (T,) datetime64[s], ``frequency`` apart
    latitudes: np.ndarray  # (G,) float64 degrees
    longitudes: np.ndarray  # (G,) float64 degrees
    attrs: dict[str, Any]  # constant_fields, variables_metadata (units)

    @property
    def shape(self) -> tuple[int, int, int, int]: ...  # (T, V, 1, G)

    def variable_indices(self, names: Sequence[str]) -> np.ndarray: ...

    def read(self, dates: slice, variables: np.ndarray, grid: slice = slice(None)) -> np.ndarray: ...


def describe(store: StateSource) -> str:
    """How messages name ``store``: ``dataset PATH``, ``input FILE`` or ``input files FILE, FILE``."""
    return store.label if isinstance(store, FileStates) else f"dataset {store.path}"


def provenance(store: StateSource) -> dict[str, str]:
    """The forecast file's attribute naming where its initial states came from: ``dataset`` (the zarr path) or
    ``input`` (the files, comma-separated)."""
    if isinstance(store, FileStates):
        return {"input": ", ".join(map(str, store.files))}
    return {"dataset": str(store.path)}


@dataclass(frozen=True, eq=False)
class FileStates:
    """States read from GRIB or netCDF files, held in memory on a regular time axis.

    ``dates`` runs ``frequency`` apart from the first to the last time in the files; ``present`` marks the times the
    files hold. A time between them reads the fields of the latest earlier time in the files: the forecast reads such
    times only for forcings constant in time (the history states and any forcing that changes in time are checked to
    be in the files, see :mod:`anemo_like.inference.state_files`).
    """

    path: Path  # the first file
    files: tuple[Path, ...]  # every input file, as given
    label: str  # how messages name the files: input FILE, or input files FILE, FILE, ...
    variables: list[str]
    frequency: datetime.timedelta
    dates: np.ndarray  # (T,) datetime64[s]
    present: np.ndarray  # (T,) bool
    values: np.ndarray = field(repr=False)  # (present.sum(), V, G) float32
    latitudes: np.ndarray = field(repr=False)
    longitudes: np.ndarray = field(repr=False)
    attrs: dict[str, Any] = field(repr=False)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return len(self.dates), len(self.variables), 1, len(self.latitudes)

    def variable_indices(self, names: Sequence[str]) -> np.ndarray:
        """Indices of ``names`` in ``variables``, (len(names),) int64; ValueError naming unknown ones."""
        unknown = [name for name in names if name not in self.variables]
        if unknown:
            close = {name: difflib.get_close_matches(name, self.variables, n=1) for name in unknown}
            hints = [f"'{name}'" + (f" (did you mean '{c[0]}'?)" if c else "") for name, c in close.items()]
            raise ValueError(f"{self.path}: unknown variable(s) {', '.join(hints)}; available: {self.variables}")
        return np.array([self.variables.index(name) for name in names], dtype=np.int64)

    def read(self, dates: slice, variables: np.ndarray, grid: slice = slice(None)) -> np.ndarray:
        """Values of a date slice, (n_dates, len(variables), n_grid) float32."""
        rows = (np.cumsum(self.present) - 1)[dates]  # the latest time in the files at or before each date
        return self.values[rows][:, np.asarray(variables)][..., grid]


@dataclass(frozen=True, eq=False)
class FieldsRead:
    """The fields one file holds of the variables asked for: each (name, valid time) -> (G,) float32 values."""

    path: Path
    latitudes: np.ndarray  # (G,) float64 degrees
    longitudes: np.ndarray  # (G,) float64 degrees
    fields: dict[tuple[str, np.datetime64], np.ndarray]
    labels: dict[str, str] = field(default_factory=dict)  # name -> how the file format names it, for messages
    units: dict[str, str] = field(default_factory=dict)  # name -> its unit as the file states it (none: not stated)

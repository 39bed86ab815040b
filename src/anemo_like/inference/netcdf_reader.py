"""Read initial states from netCDF files.

Accepted layouts (xarray decodes the times):

- the grid: ``latitude``/``longitude`` (or ``lat``/``lon``) coordinates along one point dimension (e.g. ``values``,
  as anemo-infer writes), or 1-D ``latitude`` and ``longitude`` of a regular grid, whose fields are flattened row by
  row from north to south, each row from the first longitude on;
- a variable is matched by its name (``z_500``), or a parameter variable with a level dimension (``level``,
  ``isobaricInhPa``, ``pressure_level`` or ``plev``, in Pa when its units say so) gives ``<param>_<level>``
  (``z`` at 500 -> ``z_500``);
- its time: a ``time`` or ``valid_time`` dimension, ``time`` and ``step`` dimensions (valid time = time + step, as
  in anemo-infer's forecasts), or a scalar ``valid_time`` / ``time`` coordinate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from anemo_like.inference.state_source import FieldsRead

LATITUDES = ("latitude", "lat")
LONGITUDES = ("longitude", "lon")
LEVELS = ("level", "isobaricInhPa", "pressure_level", "plev")


def _coordinate(ds: xr.Dataset, path: Path, names: tuple[str, ...]) -> xr.DataArray:
    found = next((ds[name] for name in names if name in ds.variables), None)
    if found is None:
        raise ValueError(
            f"input {path} has no {' or '.join(names)} coordinate; expected latitude and longitude of each grid "
            "point (docs/inference.md)"
        )
    return found


def _grid(ds: xr.Dataset, path: Path) -> tuple[xr.Dataset, tuple[str, ...], np.ndarray, np.ndarray]:
    """(the dataset, north to south, its point dimensions, latitudes (G,), longitudes (G,))."""
    lat, lon = _coordinate(ds, path, LATITUDES), _coordinate(ds, path, LONGITUDES)
    if lat.ndim == 1 and lat.dims == lon.dims:
        return ds, lat.dims, lat.values.astype(np.float64), lon.values.astype(np.float64)
    if lat.ndim == 1 and lon.ndim == 1:
        if lat.size > 1 and lat.values[0] < lat.values[-1]:
            ds = ds.isel({lat.dims[0]: slice(None, None, -1)})
            lat = ds[lat.name]
        lat2, lon2 = np.meshgrid(lat.values.astype(np.float64), lon.values.astype(np.float64), indexing="ij")
        return ds, (lat.dims[0], lon.dims[0]), lat2.ravel(), lon2.ravel()
    raise ValueError(
        f"input {path}: its latitude and longitude have dimensions {lat.dims} and {lon.dims}; expected both along "
        "one point dimension, or 1-D coordinates of a regular grid"
    )


def _valid_times(ds: xr.Dataset, var: xr.DataArray, dims: list[str], path: Path) -> np.ndarray:
    """The valid time of each index of ``dims`` (flattened, C order), datetime64[s]."""
    if not dims:
        scalar = next((ds[name] for name in ("valid_time", "time") if name in ds.variables), None)
        if scalar is None or scalar.ndim:
            raise ValueError(f"input {path}: variable {var.name} has no time (a time or valid_time coordinate)")
        return np.atleast_1d(scalar.values.astype("datetime64[s]"))
    if dims == ["time", "step"]:
        valid = ds["time"].values[:, None] + ds["step"].values[None, :]
        return valid.ravel().astype("datetime64[s]")
    if len(dims) == 1 and dims[0] in ("time", "valid_time"):
        return ds[dims[0]].values.astype("datetime64[s]")
    raise ValueError(
        f"input {path}: variable {var.name} has dimensions {var.dims}; expected time (or valid_time, or time and "
        "step), an optional level and the grid's"
    )


def _levels(var: xr.DataArray, level: str | None) -> list[str]:
    """The variable names of ``var``: its own, or ``<param>_<level>`` per level (hPa)."""
    if level is None:
        return [str(var.name)]
    values = var[level].values.astype(np.float64)
    if var[level].attrs.get("units") == "Pa":
        values = values / 100.0
    return [f"{var.name}_{round(value)}" for value in values]


def _fields_of(ds: xr.Dataset, var: xr.DataArray, points: tuple[str, ...], wanted: set[str], path: Path) -> dict:
    level = next((d for d in var.dims if d in LEVELS), None)
    names = _levels(var, level)
    if not wanted.intersection(names):
        return {}
    time_dims = [d for d in ("time", "valid_time", "step") if d in var.dims]
    extra = [d for d in var.dims if d not in (*points, *time_dims, level)]
    if extra:
        raise ValueError(
            f"input {path}: variable {var.name} has the dimension(s) {', '.join(extra)}; expected time (or "
            "valid_time, or time and step), an optional level and the grid's"
        )
    times = _valid_times(ds, var, time_dims, path)
    order = [*time_dims, *([level] if level else []), *points]
    values = var.transpose(*order).values.reshape(len(times), len(names), -1).astype(np.float32)
    return {
        (name, time): values[t, n] for t, time in enumerate(times) for n, name in enumerate(names) if name in wanted
    }


def read_netcdf(path: Path, names: list[str]) -> FieldsRead:
    """The fields of ``names`` in netCDF file ``path``; ValueError naming the file and what is wrong."""
    try:
        ds = xr.open_dataset(path)
    except (OSError, ValueError) as error:
        raise ValueError(f"input {path} is not a readable netCDF file ({error})") from None
    with ds:
        ds, points, lat, lon = _grid(ds, path)
        fields: dict = {}
        for var in ds.data_vars.values():
            if not set(points) <= set(var.dims):
                continue
            for key, values in _fields_of(ds, var, points, set(names), path).items():
                if key in fields:
                    raise ValueError(f"input {path} holds {key[0]} at {key[1]} twice; keep one")
                fields[key] = values
    return FieldsRead(path, lat, lon, fields)

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


def _second_times() -> object:
    """Decode CF times to datetime64[s], which reaches years beyond 2262 (nanoseconds do not); True on an xarray
    without the option (before 2025.01)."""
    coder = getattr(getattr(xr, "coders", None), "CFDatetimeCoder", None)
    return coder(time_unit="s") if coder is not None else True


def _coordinate(ds: xr.Dataset, path: Path, names: tuple[str, ...]) -> xr.DataArray:
    found = next((ds[name] for name in names if name in ds.variables), None)
    if found is None:
        raise ValueError(
            f"input {path} has no {' or '.join(names)} coordinate: add the latitude and longitude (degrees) of its "
            "grid points as coordinates (docs/inference.md)"
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
        f"input {path}: its latitude and longitude have dimensions ({', '.join(map(str, lat.dims))}) and "
        f"({', '.join(map(str, lon.dims))}); expected both along one point dimension, or 1-D coordinates of a regular "
        "grid: stack the fields' grid dimensions into one, or interpolate to the model's grid"
    )


def _layout_error(path: Path, var: xr.DataArray, points: tuple[str, ...]) -> ValueError:
    return ValueError(
        f"input {path}: variable {var.name} has dimensions ({', '.join(map(str, var.dims))}); expected time (or "
        f"valid_time, or time and step), an optional level ({', '.join(LEVELS)}) and the grid's "
        f"({', '.join(points)}): select one value of the other dimensions, or rename them"
    )


def _valid_times(ds: xr.Dataset, var: xr.DataArray, dims: list[str], path: Path, points: tuple[str, ...]) -> np.ndarray:
    """The valid time of each index of ``dims`` (flattened, C order), datetime64[s]."""
    if not dims:
        scalar = next((ds[name] for name in ("valid_time", "time") if name in ds.variables), None)
        if scalar is None or scalar.ndim:
            raise ValueError(
                f"input {path}: variable {var.name} has no time: add its valid time as a time dimension or a scalar "
                "valid_time coordinate"
            )
        return np.atleast_1d(scalar.values.astype("datetime64[s]"))
    if dims == ["time", "step"]:
        valid = ds["time"].values[:, None] + ds["step"].values[None, :]
        return valid.ravel().astype("datetime64[s]")
    if len(dims) == 1 and dims[0] in ("time", "valid_time"):
        return ds[dims[0]].values.astype("datetime64[s]")
    raise _layout_error(path, var, points)


def _levels(var: xr.DataArray, level: str | None) -> list[str]:
    """The variable names of ``var``: its own, or ``<param>_<level>`` per level (hPa)."""
    if level is None:
        return [str(var.name)]
    values = var[level].values.astype(np.float64)
    if var[level].attrs.get("units") == "Pa":
        values = values / 100.0
    return [f"{var.name}_{round(value)}" for value in values]


def _fields_of(
    ds: xr.Dataset, var: xr.DataArray, points: tuple[str, ...], wanted: set[str], path: Path
) -> list[tuple[tuple[str, np.datetime64], np.ndarray]]:
    """Each (name, valid time) of ``wanted`` that ``var`` holds, with its values (G,) float32, in order."""
    level = next((d for d in var.dims if d in LEVELS), None)
    names = _levels(var, level)
    if not wanted.intersection(names):
        return []
    time_dims = [d for d in ("time", "valid_time", "step") if d in var.dims]
    extra = [d for d in var.dims if d not in (*points, *time_dims, level)]
    if extra:
        raise _layout_error(path, var, points)
    times = _valid_times(ds, var, time_dims, path, points)
    order = [*time_dims, *([level] if level else []), *points]
    values = var.transpose(*order).values.reshape(len(times), len(names), -1).astype(np.float32)
    return [
        ((name, time), values[t, n]) for t, time in enumerate(times) for n, name in enumerate(names) if name in wanted
    ]


def read_netcdf(path: Path, names: list[str]) -> FieldsRead:
    """The fields of ``names`` in netCDF file ``path``; ValueError naming the file and what is wrong."""
    try:
        ds = xr.open_dataset(path, decode_times=_second_times())
    except (OSError, ValueError, IndexError):  # no engine opens it (the cause lists the engines), or it is cut short
        raise ValueError(
            f"input {path} is not a readable netCDF file: copy or write it again, or name a GRIB file .grib (a "
            "netCDF-4 file needs the netCDF4 or h5netcdf package)"
        ) from None
    with ds:
        ds, points, lat, lon = _grid(ds, path)
        fields: dict = {}
        source: dict = {}  # the variable of each field
        units: dict[str, str] = {}
        for var in ds.data_vars.values():
            if not set(points) <= set(var.dims):
                continue
            for key, values in _fields_of(ds, var, points, set(names), path):
                if key in fields:
                    held = (
                        f"in variable {var.name}, whose times repeat"
                        if source[key] == var.name
                        else f"in variables {source[key]} and {var.name}"
                    )
                    raise ValueError(f"input {path} holds {key[0]} at {key[1]} twice ({held}); keep one")
                fields[key], source[key] = values, var.name
                if var.attrs.get("units") not in (None, ""):
                    units[key[0]] = str(var.attrs["units"])
    return FieldsRead(path, lat, lon, fields, units=units)

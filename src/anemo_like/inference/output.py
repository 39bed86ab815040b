"""The forecast file: a CF-style xarray Dataset written to netCDF (.nc) or zarr (.zarr), replaced atomically."""

from __future__ import annotations

import asyncio
import datetime
import importlib.util
import json
import logging
import os
import shutil
import uuid
from pathlib import Path

import numpy as np
import xarray as xr
import zarr
import zarr.core.sync

import anemo_like
from anemo_like.atomic_io import disk_full
from anemo_like.config.inference import GRIB_SUFFIXES
from anemo_like.data.zarr_store import format_frequency
from anemo_like.inference.grib_messages import grib_origin
from anemo_like.inference.inputs import ForecastInputs, variable_metadata
from anemo_like.inference.mars_keys import load_eccodes
from anemo_like.inference.state_source import provenance
from anemo_like.interrupts import deferred

LOG = logging.getLogger(__name__)

FORECAST_TITLE = "anemo_like forecast"  # the global attribute that marks a forecast this package may replace
TEMPORARY_PREFIX = ".{name}.tmp-"  # the sibling a forecast is written to before it is renamed into place


def netcdf_engine() -> str:
    """netcdf4 (netCDF-4) when the netCDF4 package is installed, else scipy (netCDF-3, always there)."""
    return "netcdf4" if importlib.util.find_spec("netCDF4") is not None else "scipy"


def check_writable(path: Path, *, key: str) -> None:
    """Raise ValueError (naming config ``key``) unless a file can be created beside ``path``; creates its folder."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        probe = path.parent / f".{path.name}.write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ValueError(
            f"{key} {path} cannot be written ({error.strerror}); choose a path in a folder you can write ({key}=...)"
        ) from None


def _zarr_attributes(path: Path) -> dict | None:
    """The root attributes of the zarr store at ``path`` (format 2 or 3), or None when it is not one."""
    for name, key in ((".zattrs", None), ("zarr.json", "attributes")):
        if (path / name).is_file():
            try:
                document = json.loads((path / name).read_text())
            except (OSError, ValueError):
                return {}
            return document.get(key, {}) if key else document
    return {} if (path / ".zgroup").is_file() or (path / ".zarray").is_file() else None


def netcdf_attributes(path: Path) -> dict | None:
    """The global attributes of the netCDF file at ``path``, or None when it cannot be read as one."""
    try:
        with xr.open_dataset(path, engine=netcdf_engine(), decode_times=False) as dataset:
            return dict(dataset.attrs)
    except (OSError, ValueError, TypeError, RuntimeError):
        return None


def _is_our_forecast(attrs: dict | None) -> bool:
    return attrs is not None and attrs.get("title") == FORECAST_TITLE and "package_version" in attrs


def _is_ours(path: Path) -> bool:
    """Whether the existing ``path`` holds a forecast anemo-infer wrote: a zarr store or netCDF file with its
    attributes, or a GRIB file whose first message carries its marker (grib_messages.MARKER)."""
    if path.is_dir():
        return _is_our_forecast(_zarr_attributes(path))
    if path.suffix == ".nc":
        return _is_our_forecast(netcdf_attributes(path))
    return path.suffix in GRIB_SUFFIXES and grib_origin(load_eccodes(f"output {path}"), path) == "ours"


def _contents(path: Path) -> str:
    """What the existing ``path`` holds, in words, for a refusal message."""
    if path.is_dir():
        attrs = _zarr_attributes(path)
        if attrs is None:
            return "a folder that is not a zarr store"
        return "an anemoi-datasets dataset" if "variables" in attrs else "a zarr store not written by anemo-infer"
    if path.suffix == ".nc" and netcdf_attributes(path) is not None:
        return "a netCDF file not written by anemo-infer"
    if path.suffix in GRIB_SUFFIXES and grib_origin(load_eccodes(f"output {path}"), path) == "grib":
        return "a GRIB file not written by anemo-infer"
    return "a file that is not a forecast of anemo-infer"


def check_output(path: Path, *, remove_stale: bool = True) -> None:
    """Raise ValueError unless the forecast file (.nc, GRIB) or store (.zarr) can be written at ``path``.

    An existing ``path`` is replaced only when it holds a forecast this package wrote (recognised by its
    attributes, or a GRIB file's marker); the input dataset, any other store, file or folder is refused, as is a
    path inside a zarr store.
    """
    if path.suffix in GRIB_SUFFIXES:
        load_eccodes(f"output {path}")  # refused without ecCodes, before anything else
    check_writable(path, key="output")
    if remove_stale:  # the temporary copies a killed anemo-infer left (one rank cleans)
        _remove_stale_temporaries(path)
    for parent in path.parents:
        if parent.is_dir() and _zarr_attributes(parent) is not None:
            raise ValueError(
                f"output {path} lies inside the zarr store {parent}; choose a path outside it (output=...)"
            )
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or path.is_dir() != (path.suffix == ".zarr") or not _is_ours(path):
        what = "a symbolic link" if path.is_symlink() else _contents(path)
        raise ValueError(
            f"output {path} holds {what}; anemo-infer only replaces a forecast it wrote itself: "
            "remove it yourself or choose another path (output=...)"
        )


def forecast_dataset(
    forecasts: np.ndarray, inputs: ForecastInputs, *, checkpoint: Path, precision: str, ensemble_stats: bool = False
) -> xr.Dataset:
    """CF-style Dataset of ``forecasts`` (N, M, L, G, V_out), physical units.

    Dimensions ``time`` (initial date), ``number`` (ensemble member 0 .. M - 1; only when M > 1), ``step`` (lead
    time, timedelta) and ``values`` (grid point); coordinates ``latitude`` / ``longitude`` (degrees) and
    ``valid_time`` (time + step); one variable per output variable. ``ensemble_stats`` adds ``<name>_mean`` and
    ``<name>_spread`` (the members' standard deviation, ddof 1), without ``number``.
    """
    store, roles = inputs.store, inputs.roles
    members = forecasts.shape[1]
    times = inputs.init_dates.astype("datetime64[ns]")
    steps = (np.arange(1, inputs.steps + 1) * np.timedelta64(int(inputs.step.total_seconds()), "s")).astype(
        "timedelta64[ns]"
    )
    coords = {
        "time": ("time", times, {"standard_name": "forecast_reference_time", "long_name": "initial date"}),
        "step": ("step", steps, {"standard_name": "forecast_period", "long_name": "lead time"}),
        "valid_time": (("time", "step"), times[:, None] + steps[None, :], {"standard_name": "time"}),
        "latitude": ("values", store.latitudes, {"standard_name": "latitude", "units": "degrees_north"}),
        "longitude": ("values", store.longitudes, {"standard_name": "longitude", "units": "degrees_east"}),
    }
    if members > 1:
        coords["number"] = ("number", np.arange(members), {"standard_name": "realization", "long_name": "member"})
    variables = {}
    for v, name in enumerate(roles.output):
        attrs = {"long_name": name, "role": "prognostic" if name in roles.prognostic else "diagnostic"}
        units = variable_metadata(store, name).get("units")
        if units is not None:
            attrs["units"] = str(units)
        if members == 1:
            variables[name] = (("time", "step", "values"), forecasts[:, 0, ..., v], attrs)
            continue
        variables[name] = (("time", "number", "step", "values"), forecasts[..., v], attrs)
        if ensemble_stats:
            variables.update(_ensemble_stats(name, forecasts[..., v], attrs))
    return xr.Dataset(variables, coords=coords, attrs=_global_attributes(inputs, checkpoint, precision, members))


def _ensemble_stats(name: str, members: np.ndarray, attrs: dict[str, str]) -> dict[str, tuple]:
    """``<name>_mean`` and ``<name>_spread`` (standard deviation, ddof 1) of ``members`` (N, M, L, G) over the
    members, float32 (computed in float64), as (dims, values, attrs) of (time, step, values)."""
    stats = {
        "mean": ("mean", members.mean(axis=1, dtype=np.float64)),
        "spread": ("standard_deviation", members.std(axis=1, ddof=1, dtype=np.float64)),
    }
    return {
        f"{name}_{kind}": (
            ("time", "step", "values"),
            value.astype(np.float32),
            {**attrs, "long_name": f"{name} ensemble {kind}", "cell_methods": f"number: {method}"},
        )
        for kind, (method, value) in stats.items()
    }


def _global_attributes(inputs: ForecastInputs, checkpoint: Path, precision: str, members: int) -> dict[str, str]:
    attrs = {
        "Conventions": "CF-1.8",
        "title": FORECAST_TITLE,
        "source": f"anemo_like {anemo_like.__version__} (anemo-infer)",
        "package_version": anemo_like.__version__,
        "checkpoint": str(checkpoint),
        **provenance(inputs.store),
        "model_step": format_frequency(inputs.step),
        "precision": precision,
        "history": f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} anemo-infer",
    }
    if members > 1:
        attrs["ensemble_members"] = str(members)
    return attrs


def write_forecast(dataset: xr.Dataset, path: Path) -> None:
    """Write via a temporary sibling then rename: ``path`` holds the old forecast or the whole new one. A stop
    signal abandons the temporary copy, or, once the swap has begun, lets it finish."""
    tmp = path.with_name(f"{TEMPORARY_PREFIX.format(name=path.name)}{uuid.uuid4().hex[:8]}")
    try:
        try:
            if path.suffix == ".nc":
                dataset.to_netcdf(tmp, engine=netcdf_engine())
            else:
                try:
                    dataset.to_zarr(tmp, mode="w-", zarr_format=2, consolidated=True)
                except OSError:
                    zarr.core.sync.sync(_settle_zarr_writes())
                    raise
        except OSError as error:
            raise disk_full(error, path, setting="output") from None
        with deferred():
            if path.is_dir():
                shutil.rmtree(path)  # an earlier zarr forecast: os.replace cannot overwrite a folder
            os.replace(tmp, path)
    finally:
        if tmp.is_dir():
            shutil.rmtree(tmp)
        tmp.unlink(missing_ok=True)


async def _settle_zarr_writes() -> None:
    """Wait for the writes zarr still runs after one of them failed, taking their errors: a write that ended
    after the temporary copy was removed would otherwise fail late and asyncio would log its traceback."""
    running = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    await asyncio.gather(*running, return_exceptions=True)


def open_forecast(path: Path) -> xr.Dataset:
    """Open a forecast written by :func:`write_forecast` (lazily)."""
    return xr.open_dataset(path, engine="zarr" if path.suffix == ".zarr" else None)


def _remove_stale_temporaries(path: Path) -> None:
    """Delete the temporary copies of ``path`` that a killed anemo-infer left beside it."""
    for stale in path.parent.glob(f"{TEMPORARY_PREFIX.format(name=path.name)}*"):
        shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink(missing_ok=True)
        LOG.info("removed %s, left by a killed anemo-infer", stale)


def check_finite_forecasts(forecasts: np.ndarray, inputs: ForecastInputs, *, checkpoint: Path) -> None:
    """Raise :class:`NonFiniteForecast` naming the first initial date, member (of an ensemble), lead and variables
    where ``forecasts`` (N, M, L, G, V_out) hold NaN or inf; the NaN of the outputs the model leaves missing where
    their input was (its imputer) are no fault."""
    bad = ~np.isfinite(forecasts)
    restored = [v for v, name in enumerate(inputs.roles.output) if name in inputs.restored]
    bad[..., restored] &= ~np.isnan(forecasts[..., restored])
    if not bad.any():
        return
    n, k, lead = (int(i) for i in np.argwhere(bad.any(axis=(3, 4)))[0])
    names = [name for v, name in enumerate(inputs.roles.output) if bad[n, k, lead, :, v].any()]
    points = int(bad[n, k, lead].any(axis=1).sum())
    member = f" (member {k})" if forecasts.shape[1] > 1 else ""
    raise NonFiniteForecast(
        f"the forecast from {inputs.init_dates[n]}{member} holds NaN or inf from lead step {lead + 1} "
        f"(+{format_frequency(inputs.step * (lead + 1))}) on, first in {', '.join(names)} ({points} of "
        f"{bad.shape[3]} points); the model of {checkpoint} does not give finite values from these inputs "
        "(a diverged training run, or inputs unlike its training data): no forecast was written"
    )


class NonFiniteForecast(RuntimeError):
    """The model's forecast holds NaN or inf."""

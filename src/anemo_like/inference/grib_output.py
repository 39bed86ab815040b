"""The forecast as GRIB2 (``output=forecast.grib``): one message per initial date, lead time, variable and member
(and ensemble mean and spread), simple packing, written through ecCodes to a temporary sibling then renamed.

Everything that can fail before the forecasts is checked by :func:`prepare_grib` at set-up: each variable's GRIB
parameter, the grib.encoding keys, the grid; an unstructured grid's coordinates go to ``<output>.grid.nc``.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType

import numpy as np
import xarray as xr

import anemo_like
from anemo_like.atomic_io import disk_full
from anemo_like.checkpoints.inference import InferenceBundle
from anemo_like.config.inference import GRIB_SUFFIXES, GribConfig, InferenceConfig, MarsKeys
from anemo_like.data.grid_kinds import TOLERANCE, UNSTRUCTURED, GridKind, classify_grid
from anemo_like.data.zarr_store import AnemoiZarr
from anemo_like.inference.grib_messages import (
    grid_handle,
    grid_identity,
    set_encoding,
    set_marker,
    set_parameter,
)
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.inference.mars_keys import load_eccodes, metadata_sources, resolve_mars_keys
from anemo_like.inference.output import TEMPORARY_PREFIX, netcdf_attributes, netcdf_engine
from anemo_like.inference.units import same_unit, to_model_units, usual_unit
from anemo_like.interrupts import deferred

LOG = logging.getLogger(__name__)
GRID_TITLE = "anemo_like forecast grid"  # the global attribute of the coordinates file of an unstructured grid
TYPES = {"fc": {}, "pf": {"productDefinitionTemplateNumber": 1}, "em": {}, "es": {}}  # MARS type: its other keys
STATISTICS = {"em": "mean", "es": "spread"}  # the ensemble statistics' types and their variables' suffixes


@dataclass(frozen=True, kw_only=True)
class GribPlan:
    """What the GRIB file holds and how it is encoded, checked at set-up."""

    path: Path
    keys: dict[str, MarsKeys]  # each output variable's parameter and level
    kind: GridKind
    latitudes: np.ndarray  # (G,) degrees, message value order
    longitudes: np.ndarray  # (G,) degrees
    encoding: dict[str, str | int]  # grib.encoding
    bits: int  # grib.bits_per_value
    members: int
    ensemble_stats: bool
    units: dict[str, tuple[str, str]] = field(default_factory=dict)  # (model's, GRIB's) where they differ

    @property
    def identity(self) -> str:
        return grid_identity(self.latitudes, self.longitudes)

    @property
    def grid_file(self) -> Path | None:
        """The coordinates file of an unstructured grid (None for the other kinds)."""
        return self.path.with_name(f"{self.path.name}.grid.nc") if self.kind.name == "unstructured" else None

    @property
    def types(self) -> list[str]:
        """The MARS types written: fc; or pf, and em and es with ensemble_stats."""
        if self.members == 1:
            return ["fc"]
        return ["pf", *(STATISTICS if self.ensemble_stats else [])]


def prepare_grib(config: InferenceConfig, *, bundle: InferenceBundle, inputs: ForecastInputs, output: Path,
                 checkpoint: Path, dataset: AnemoiZarr | None) -> GribPlan | None:  # fmt: skip
    """Check a GRIB output before any forecast runs: each output variable's parameter, from grib.variables or the
    variables_metadata of the checkpoint or of ``dataset`` (ValueError naming those without one), then
    :func:`grib_plan`. None when ``output`` is not GRIB (netCDF, zarr)."""
    if output.suffix not in GRIB_SUFFIXES:
        return None
    load_eccodes(f"output {output}")
    store = inputs.store
    keys = resolve_mars_keys(
        inputs.roles.output,
        table=config.grib.variables,
        metadata=metadata_sources(checkpoint, bundle.variables_metadata, dataset),
    )
    known = {
        **(dataset.attrs.get("variables_metadata") or {} if dataset is not None else {}),
        **bundle.variables_metadata,
    }
    units = {name: (known.get(name) or {}).get("units") or usual_unit(name) for name in inputs.roles.output}
    return grib_plan(
        output,
        keys=keys,
        latitudes=store.latitudes,
        longitudes=store.longitudes,
        grib=config.grib,
        members=config.members,
        ensemble_stats=config.ensemble_stats,
        model_units=units,
    )


def grib_plan(output: Path, *, keys: dict[str, MarsKeys], latitudes: np.ndarray, longitudes: np.ndarray,
              grib: GribConfig, members: int, ensemble_stats: bool,
              model_units: dict[str, str | None] | None = None) -> GribPlan:  # fmt: skip
    """The plan of a GRIB file of the variables of ``keys`` on the grid (latitudes, longitudes) (G,) degrees, after
    setting every parameter and grib.encoding key once (ValueError naming the one ecCodes refuses), finding the
    grid's kind (unstructured when ecCodes would not give these coordinates back within 1e-6 degrees) and
    checking the path of an unstructured grid's coordinates file. ``model_units``: each variable's unit in the
    model; a GRIB parameter in another is written converted to it (ValueError when it does not convert)."""
    ec = load_eccodes(f"output {output}")
    latitudes, longitudes = (np.asarray(a, dtype=np.float64) for a in (latitudes, longitudes))
    plan = GribPlan(
        path=output,
        keys=dict(keys),
        kind=_grib_grid(ec, latitudes, longitudes, bits=grib.bits_per_value),
        latitudes=latitudes,
        longitudes=longitudes,
        encoding=dict(grib.encoding),
        bits=grib.bits_per_value,
        members=members,
        ensemble_stats=ensemble_stats,
    )
    try:
        templates = _templates(ec, plan)
        try:
            _trial_messages(ec, plan, templates)
            plan = replace(plan, units=_units_to_convert(ec, output, templates, model_units or {}))
        finally:
            for handle in templates.values():
                ec.codes_release(handle)
    except ec.GribInternalError as error:  # the encoding keys leave messages the writer cannot fill
        given = ", ".join(f"{k}={v!r}" for k, v in plan.encoding.items())
        raise ValueError(
            f"grib.encoding ({given}): ecCodes cannot write anemo-infer's messages with these keys ({error}); "
            "anemo-infer writes GRIB2 with ECMWF's local definition: remove the key that changes the message's "
            "layout (edition, ...)"
        ) from None
    if plan.grid_file is not None:
        _check_grid_file(plan.grid_file, output)
    return plan


def _grib_grid(ec: ModuleType, latitudes: np.ndarray, longitudes: np.ndarray, *, bits: int) -> GridKind:
    """The kind of the dataset's grid, unstructured unless ecCodes' own coordinates of it are the dataset's (within
    :data:`~anemo_like.data.grid_kinds.TOLERANCE`; e.g. lat/lon increments that are not whole micro-degrees)."""
    kind = classify_grid(latitudes, longitudes)
    if kind.name == "unstructured":
        return kind
    handle = grid_handle(ec, kind, identity="", size=len(latitudes), bits=bits)
    try:
        ec.codes_set_values(handle, np.zeros(len(latitudes)))
        lat, lon = (ec.codes_get_array(handle, key) for key in ("latitudes", "longitudes"))
    finally:
        ec.codes_release(handle)
    lon_error = np.abs((lon - longitudes + 180.0) % 360.0 - 180.0)
    if lat.shape != latitudes.shape or max(np.abs(lat - latitudes).max(), lon_error.max()) > TOLERANCE:
        LOG.info("the %s grid of the dataset is not exactly representable in GRIB2: written unstructured", kind.name)
        return UNSTRUCTURED
    return kind


def _our_grid_file(output: Path) -> Path | None:
    """``OUT.grid.nc`` beside ``output`` when it is a coordinates file anemo-infer wrote, else None."""
    path = output.with_name(f"{output.name}.grid.nc")
    if path.is_symlink() or not path.is_file():
        return None
    attrs = netcdf_attributes(path)
    return path if attrs is not None and attrs.get("title") == GRID_TITLE else None


def _check_grid_file(path: Path, output: Path) -> None:
    """Refuse to write the coordinates file over anything but one anemo-infer wrote."""
    if (path.exists() or path.is_symlink()) and _our_grid_file(output) is None:
        raise ValueError(
            f"output {output} is on an unstructured grid, whose coordinates go to {path}, but that path holds "
            "something anemo-infer did not write: remove it yourself or choose another path (output=...)"
        )


def _templates(ec: ModuleType, plan: GribPlan) -> dict[tuple[str, str], int]:
    """One handle per (variable, MARS type): grid, packing, encoding, type, parameter and level set."""
    stream = "enfo" if plan.members > 1 else "oper"
    identity = plan.identity if plan.kind.name == "unstructured" else ""
    handles = {}
    try:
        for name, keys in plan.keys.items():
            for kind in plan.types:
                handle = grid_handle(ec, plan.kind, identity=identity, size=len(plan.latitudes), bits=plan.bits)
                handles[name, kind] = handle
                set_encoding(ec, handle, plan.encoding, stream=stream)
                for key, value in TYPES[kind].items():
                    ec.codes_set(handle, key, value)
                ec.codes_set_string(handle, "type", kind)
                if plan.members > 1:
                    ec.codes_set(handle, "numberOfForecastsInEnsemble", plan.members)
                set_parameter(ec, handle, keys, name=name)
                set_marker(ec, handle)
    except BaseException:
        for handle in handles.values():
            ec.codes_release(handle)
        raise
    return handles


def _trial_messages(ec: ModuleType, plan: GribPlan, templates: dict[tuple[str, str], int]) -> None:
    """Encode one message of each template as the writer does (date, step, member, values), so that keys which
    leave messages it cannot write are refused before the forecasts run."""
    zeros = np.zeros(len(plan.latitudes))
    for (_, kind), handle in templates.items():
        ec.codes_set(handle, "dataDate", 20000101)
        ec.codes_set(handle, "dataTime", 0)
        ec.codes_set_string(handle, "stepUnits", "h")
        ec.codes_set(handle, "step", 6)
        if kind == "pf":
            ec.codes_set(handle, "number", 1)
        ec.codes_set_values(handle, zeros)
        ec.codes_get_message(handle)


def write_grib(dataset: xr.Dataset, plan: GribPlan) -> None:
    """Write ``dataset`` (:func:`~anemo_like.inference.output.forecast_dataset`) as GRIB2 to ``plan.path`` via a
    temporary sibling then rename (with an unstructured grid's coordinates file first): ``plan.path`` holds the old
    forecast or the whole new one. A full disk raises DiskFull naming the path."""
    ec = load_eccodes(f"output {plan.path}")
    tmp = plan.path.with_name(f"{TEMPORARY_PREFIX.format(name=plan.path.name)}{uuid.uuid4().hex[:8]}")
    grid_tmp = tmp.with_name(f"{tmp.name}.grid.nc")  # a stale copy is found by the same prefix
    try:
        try:
            with open(tmp, "wb", buffering=1 << 22) as file:
                for message in _messages(ec, dataset, plan):
                    file.write(message)
            if plan.grid_file is not None:
                _write_grid_file(grid_tmp, plan)
        except OSError as error:
            raise disk_full(error, plan.path, setting="output") from None
        stale = _our_grid_file(plan.path) if plan.grid_file is None else None  # of an earlier unstructured forecast
        with deferred():
            if plan.grid_file is not None:
                os.replace(grid_tmp, plan.grid_file)
            os.replace(tmp, plan.path)
            if stale is not None:
                stale.unlink(missing_ok=True)
    finally:
        tmp.unlink(missing_ok=True)
        grid_tmp.unlink(missing_ok=True)


def _messages(ec: ModuleType, dataset: xr.Dataset, plan: GribPlan) -> Iterator[bytes]:
    """The encoded messages: per initial date, lead time and variable, the members (number 1 .. M; 0 is a
    control in GRIB), then the ensemble mean and spread; each sets only its date, step, number and values."""
    templates = _templates(ec, plan)
    try:
        steps = dataset["step"].values.astype("timedelta64[s]").astype(np.int64)  # (L,) seconds
        unit, seconds = ("h", 3600) if np.all(steps % 3600 == 0) else ("m", 60)
        fields = {
            (name, kind): _in_grib_units(_field(dataset, name, kind), name, kind, plan) for name, kind in templates
        }
        for n, time in enumerate(dataset["time"].values.astype("datetime64[m]").astype(object)):
            for handle in templates.values():
                ec.codes_set(handle, "dataDate", time.year * 10000 + time.month * 100 + time.day)
                ec.codes_set(handle, "dataTime", time.hour * 100 + time.minute)
                ec.codes_set_string(handle, "stepUnits", unit)
            for lead, step in enumerate(steps):
                for (name, kind), handle in templates.items():
                    ec.codes_set(handle, "step", int(step // seconds))
                    values = fields[name, kind][n]  # (M, L, G) or (L, G)
                    for member, field in enumerate(values[:, lead] if kind == "pf" else values[lead][None]):
                        if kind == "pf":
                            ec.codes_set(handle, "number", member + 1)
                        _set_values(ec, handle, field.astype(np.float64))
                        yield ec.codes_get_message(handle)
    finally:
        for handle in templates.values():
            ec.codes_release(handle)


def _set_values(ec: ModuleType, handle: int, values: np.ndarray) -> None:
    """Encode ``values`` (G,): NaN (an imputed variable's missing points, say) as missing in a bitmap, with a
    missing value that no real value equals."""
    missing = np.isnan(values)
    ec.codes_set(handle, "bitmapPresent", int(missing.any()))
    if missing.any():
        fill = 9999.0 if not np.any(values == 9999.0) else float(np.nanmax(values)) + 1.0
        ec.codes_set(handle, "missingValue", fill)
        values = np.where(missing, fill, values)
    ec.codes_set_values(handle, values)


def _units_to_convert(
    ec: ModuleType, path: Path, templates: dict[tuple[str, str], int], model_units: dict[str, str | None]
) -> dict[str, tuple[str, str]]:
    """(the model's unit, the GRIB parameter's) of each variable where they differ (converted as written);
    ValueError for a unit that does not convert (``z_500`` in K, say): the message would say something else."""
    differing = {}
    for (name, _), handle in templates.items():
        unit, grib = model_units.get(name), str(ec.codes_get(handle, "units"))
        if unit is None or grib in ("", "unknown", "~") or same_unit(unit, grib):
            continue
        try:
            to_model_units(np.zeros(1), name, unit, grib, f"output {path}")
        except ValueError:
            param = ec.codes_get(handle, "shortName")
            raise ValueError(
                f"output {path}: {name} is in '{unit}' in the model and GRIB parameter {param} in '{grib}', which "
                f"anemo-infer cannot convert to: map {name} to a parameter in {unit} under grib.variables"
            ) from None
        differing[name] = (unit, grib)
    return differing


def _in_grib_units(values: np.ndarray, name: str, kind: str, plan: GribPlan) -> np.ndarray:
    """``values`` of ``name`` (any shape) in its GRIB parameter's unit: a spread, a difference, without the offset."""
    if name not in plan.units:
        return values
    model, grib = plan.units[name]
    converted = to_model_units(values.astype(np.float64), name, model, grib, f"output {plan.path}")
    if kind == "es":
        converted -= to_model_units(np.zeros(1), name, model, grib, f"output {plan.path}")
    return converted


def _field(dataset: xr.Dataset, name: str, kind: str) -> np.ndarray:
    """The values of ``name`` written as MARS type ``kind``: (N, L, G), of members (N, M, L, G)."""
    if kind in STATISTICS:
        return dataset[f"{name}_{STATISTICS[kind]}"].transpose("time", "step", "values").values
    if kind == "pf":
        return dataset[name].transpose("time", "number", "step", "values").values
    return dataset[name].transpose("time", "step", "values").values


def _write_grid_file(path: Path, plan: GribPlan) -> None:
    """The coordinates of an unstructured grid, per point in message value order, as netCDF."""
    attrs = {"title": GRID_TITLE, "uuidOfHGrid": plan.identity, "forecast": plan.path.name,
             "package_version": anemo_like.__version__}  # fmt: skip
    coordinates = xr.Dataset(
        {
            "latitude": ("values", plan.latitudes, {"standard_name": "latitude", "units": "degrees_north"}),
            "longitude": ("values", plan.longitudes, {"standard_name": "longitude", "units": "degrees_east"}),
        },
        attrs=attrs,
    )
    coordinates.to_netcdf(path, engine=netcdf_engine())

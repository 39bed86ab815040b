"""The forced boundary of a limited-area forecast: from the dataset (the truth) or from a global forecast file.

A limited-area model (``data.boundary`` in its training config) predicts only its interior; at every lead time the
prognostic variables of its boundary points are replaced by forced values (:class:`ForecastSpec.forced`). Without
``boundary`` they are the dataset's own values there (the global source the dataset was made with, interpolated
to the boundary); with ``boundary=FILE`` they come from a global forecast written by ``anemo-infer``, interpolated
linearly on the sphere to the boundary points.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from anemo_like.data.interpolation import SphericalInterpolator, spherical_interpolator
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.point_masks import BOUNDARY, point_mask
from anemo_like.data.zarr_store import AnemoiZarr
from anemo_like.inference.state_source import StateSource, describe
from anemo_like.inference.units import to_model_units, usual_unit

GRIB_SUFFIXES = (".grib", ".grib1", ".grib2", ".grb", ".grb2")


@dataclass(frozen=True, kw_only=True)
class BoundaryForcing:
    """Forced prognostic values of the boundary points (``forced``, (G,) bool) at the forecasts' valid times."""

    forced: np.ndarray  # (G,) bool
    names: list[str]  # the prognostic variables, in the model's order
    normalizer: Normalizer  # of ``names``
    store: StateSource  # the dataset: its boundary values at the valid times (used without a file)
    file: Path | None = None
    fields: xr.Dataset | None = None  # the global forecast: (time, step, values) per name
    interpolation: SphericalInterpolator | None = None  # global forecast points -> forced points

    def physical(self, init: np.datetime64, valid: np.datetime64, grid: slice = slice(None)) -> np.ndarray:
        """Forced values (V, g_forced) float32 in physical units at ``valid`` of the forced points inside ``grid`` (a
        block of the grid points), for the forecast from ``init``."""
        forced = np.flatnonzero(self.forced)
        start, stop, _ = grid.indices(self.forced.size)
        inside = (forced >= start) & (forced < stop)
        if self.fields is None:
            return self._dataset_values(valid, forced[inside])
        return self._file_values(init, valid)[:, inside]

    def check_covers(self, inits: np.ndarray, step: np.timedelta64, steps: int) -> None:
        """Before any forecast runs: the file holds a forecast from each of ``inits`` with every lead time (``steps``
        of ``step``), finite at the boundary; ValueError names the file and what is missing."""
        if self.fields is None:
            return
        times = self.fields["time"].values.astype("datetime64[s]")
        held = self.fields["step"].values.astype("timedelta64[s]")
        needed = np.arange(1, steps + 1) * step.astype("timedelta64[s]")
        for init in inits:
            if init not in times:
                raise ValueError(
                    f"boundary {self.file}: no forecast from {init} (it holds initial dates "
                    f"{', '.join(map(str, times))}); run the global model from the same initial date"
                )
            short = [f"{int(s // np.timedelta64(1, 'h'))}h" for s in needed if s not in held]
            if short:
                reach = f"{int(held.max() // np.timedelta64(1, 'h'))}h" if held.size else "no step"
                raise ValueError(
                    f"boundary {self.file}: its forecast from {init} reaches {reach}, this forecast needs every step "
                    f"to {short[-1]} (missing {', '.join(short)}); run the global model as far"
                )
        for name in self.names:
            bad = ~np.isfinite(self.fields[name].values)
            if bad.any():
                t, k = (int(i) for i in np.argwhere(bad.any(axis=-1))[0])
                raise ValueError(
                    f"boundary {self.file}: {name} holds NaN or inf in its forecast from {times[t]} at step "
                    f"{int(held[k] // np.timedelta64(1, 'h'))}h; drive the boundary with a complete forecast"
                )

    def values(self, init: np.datetime64, valid: np.datetime64, grid: slice) -> np.ndarray:
        """:meth:`physical`, normalised."""
        return self.normalizer.normalize(self.physical(init, valid, grid), axis=0)

    def _dataset_values(self, valid: np.datetime64, points: np.ndarray) -> np.ndarray:
        row = int(np.searchsorted(self.store.dates, valid))
        if row >= len(self.store.dates) or self.store.dates[row] != valid:
            raise ValueError(
                f"the boundary of this limited-area forecast needs {describe(self.store)} at {valid}, which it does "
                "not hold; give a global forecast as boundary=FILE or choose an earlier initial date"
            )
        values = self.store.read(slice(row, row + 1), self.store.variable_indices(self.names))[0]
        return values[:, points]

    def _file_values(self, init: np.datetime64, valid: np.datetime64) -> np.ndarray:
        fields, file = self.fields, self.file
        times = fields["time"].values.astype("datetime64[s]")
        if init not in times:
            raise ValueError(
                f"boundary {file}: no forecast from {init} (it holds initial dates {', '.join(map(str, times))}); "
                "run the global model from the same initial date"
            )
        step = (valid - init).astype("timedelta64[s]")
        steps = fields["step"].values.astype("timedelta64[s]")
        if step not in steps:
            hours = [f"{int(s // np.timedelta64(1, 'h'))}h" for s in steps]
            raise ValueError(
                f"boundary {file}: its forecast from {init} has no step {int(step // np.timedelta64(1, 'h'))}h "
                f"(steps {', '.join(hours)}); its steps must include every lead time of this forecast"
            )
        selected = fields.sel(time=np.datetime64(init, "ns"), step=np.timedelta64(step, "ns"))
        source = np.stack([selected[name].values for name in self.names]).astype(np.float64)  # (V, G_global)
        return self.interpolation.apply(source).astype(np.float32)


def boundary_forcing(
    path: str | None, *, store: AnemoiZarr, names: list[str], normalizer: Normalizer
) -> BoundaryForcing:
    """The boundary forcing of a limited-area model's forecasts from its dataset ``store`` (a view with a boundary
    mask); ``path``: a global forecast file (netCDF or zarr written by anemo-infer) that drives the boundary instead."""
    forced = point_mask(store, BOUNDARY)
    if forced is None:
        raise ValueError(f"{describe(store)} has no boundary points, which a limited-area model needs")
    forcing = BoundaryForcing(forced=forced, names=names, normalizer=normalizer, store=store)
    if path is None:
        return forcing
    file = Path(path).expanduser()
    fields = _in_model_units(_open_global_forecast(file, names), store, file)
    if fields["latitude"].size == store.latitudes.size and np.allclose(
        (fields["latitude"].values, fields["longitude"].values), (store.latitudes, store.longitudes), atol=1e-6
    ):
        raise ValueError(
            f"boundary {file}: a forecast on this model's own grid (its {store.latitudes.size} points), not a global "
            "one: the boundary must come from a forecast of a global model that covers the region"
        )
    try:
        interpolation = spherical_interpolator(
            fields["latitude"].values, fields["longitude"].values, store.latitudes[forced], store.longitudes[forced]
        )
    except ValueError as error:
        raise ValueError(
            f"boundary {file}: its grid does not cover the boundary points: {error}; give a forecast of a global model "
            "(or of one whose grid covers the region)"
        ) from None
    return BoundaryForcing(
        forced=forced,
        names=names,
        normalizer=normalizer,
        store=store,
        file=file,
        fields=fields,
        interpolation=interpolation,
    )


def _in_model_units(fields: xr.Dataset, store: AnemoiZarr, file: Path) -> xr.Dataset:
    """``fields`` converted from each variable's ``units`` attribute to the limited-area model's (its dataset's
    ``variables_metadata``, else the parameter's usual unit): a global model trained in other units drives it."""
    stored = store.attrs.get("variables_metadata") or {}
    for name, variable in fields.data_vars.items():
        target = (stored.get(name) or {}).get("units") or usual_unit(str(name))
        unit = variable.attrs.get("units")
        variable.values = to_model_units(variable.values, str(name), unit, target, f"boundary {file}")
    return fields


def _open_global_forecast(file: Path, names: list[str]) -> xr.Dataset:
    """The forecast of anemo-infer at ``file`` (netCDF or zarr): ``names`` on (time, step, values) with latitude and
    longitude, in memory; ValueError names what is missing."""
    if not file.exists():
        raise ValueError(f"boundary {file}: no such file; give a global forecast written by anemo-infer")
    wanted = "give a global model's forecast written by anemo-infer as netCDF or zarr (output=FILE.nc)"
    if file.suffix.lower() in GRIB_SUFFIXES:
        raise ValueError(f"boundary {file}: a GRIB file; {wanted}")
    if (
        (file / "data").exists()
        and (file / ".zattrs").exists()
        and "variables" in json.loads((file / ".zattrs").read_text())
    ):
        raise ValueError(
            f"boundary {file}: an anemoi dataset, not a forecast; {wanted}, or leave boundary unset: the forecast "
            "then takes its boundary from its own dataset"
        )
    try:
        fields = xr.open_zarr(file) if file.suffix == ".zarr" else xr.open_dataset(file)
    except (OSError, ValueError, KeyError, TypeError) as error:
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise ValueError(f"boundary {file}: cannot be read as a forecast of anemo-infer ({reason}); {wanted}") from None
    missing = [name for name in names if name not in fields]
    if missing or "latitude" not in fields.coords or "step" not in fields.dims:
        what = f"lacks the variable(s) {', '.join(missing)}" if missing else "is not a forecast of anemo-infer"
        raise ValueError(
            f"boundary {file}: {what}; it must hold {', '.join(names)} on (time, step, values) with latitude and "
            "longitude, as anemo-infer writes a global model's forecast"
        )
    if "number" in fields.dims:
        raise ValueError(
            f"boundary {file}: an ensemble forecast ({fields.sizes['number']} members); drive the boundary with a "
            "deterministic forecast (or one member written on its own)"
        )
    return fields[names].load()  # read once: every lead time of every forecast looks it up

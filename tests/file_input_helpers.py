"""Initial-state files for the ``input=`` tests: GRIB written field by field with ecCodes' own samples (not the
package's GRIB writer), and netCDF written with xarray, from the built-in dataset's states."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.zarr_store import AnemoiZarr

# the built-in dataset's variables in MARS keys, as inference/config/quickstart.yaml maps them
MARS = {
    "sp": ("sp", None),
    "t_850": ("t", 850),
    "u_250": ("u", 250),
    "u_850": ("u", 850),
    "v_250": ("v", 250),
    "v_850": ("v", 850),
    "z_500": ("z", 500),
}
GRIB_KEYS = [
    f"+grib.variables.{name}={{param: {param}, levtype: {'sfc' if level is None else 'pl'}"
    + ("" if level is None else f", levelist: {level}")
    + "}"
    for name, (param, level) in MARS.items()
]
INIT = np.datetime64("2000-11-02T00", "s")
HISTORY = INIT - np.timedelta64(6, "h")


def _grid_keys(nlat: int, nlon: int) -> dict[str, float | int]:
    """A cell-centred regular lat/lon grid, north to south from longitude 0 (the built-in dataset's)."""
    dlat, dlon = 180.0 / nlat, 360.0 / nlon
    return {
        "Ni": nlon,
        "Nj": nlat,
        "latitudeOfFirstGridPointInDegrees": 90.0 - dlat / 2,
        "latitudeOfLastGridPointInDegrees": -90.0 + dlat / 2,
        "longitudeOfFirstGridPointInDegrees": 0.0,
        "longitudeOfLastGridPointInDegrees": 360.0 - dlon,
        "iDirectionIncrementInDegrees": dlon,
        "jDirectionIncrementInDegrees": dlat,
    }


def grib_message(name: str, valid: np.datetime64, values: np.ndarray, *, bits: int = 24, shape=(32, 64)) -> bytes:
    """One GRIB2 message of ``name`` valid at ``valid``: analysed 6 h earlier with step 6h."""
    import eccodes

    param, level = MARS[name]
    handle = eccodes.codes_grib_new_from_samples("regular_ll_sfc_grib2" if level is None else "regular_ll_pl_grib2")
    try:
        for key, value in _grid_keys(*shape).items():
            eccodes.codes_set(handle, key, value)
        eccodes.codes_set(handle, "shortName", param)
        if level is not None:
            eccodes.codes_set(handle, "level", level)
        base = (valid - np.timedelta64(6, "h")).astype(object)
        eccodes.codes_set(handle, "dataDate", int(base.strftime("%Y%m%d")))
        eccodes.codes_set(handle, "dataTime", int(base.strftime("%H%M")))
        eccodes.codes_set(handle, "stepUnits", "h")
        eccodes.codes_set(handle, "step", 6)
        eccodes.codes_set(handle, "bitsPerValue", bits)
        eccodes.codes_set_values(handle, values.astype(np.float64))
        return eccodes.codes_get_message(handle)
    finally:
        eccodes.codes_release(handle)


def states(store: AnemoiZarr, dates: list[np.datetime64], names=PROGNOSTIC) -> np.ndarray:
    """The dataset's ``names`` at ``dates``, (T, V, G) float32."""
    rows = [int(np.searchsorted(store.dates, date)) for date in dates]
    return np.stack([store.read(slice(r, r + 1), store.variable_indices(list(names)))[0] for r in rows])


def write_grib(path: Path, store: AnemoiZarr, dates=(HISTORY, INIT), names=PROGNOSTIC, **options) -> Path:
    """Every field of ``names`` at ``dates`` from the dataset, one message each."""
    values = states(store, list(dates), names)
    with path.open("wb") as file:
        for t, date in enumerate(dates):
            for v, name in enumerate(names):
                file.write(grib_message(name, date, values[t, v], **options))
    return path


def write_netcdf(path: Path, store: AnemoiZarr, dates=(HISTORY, INIT), names=PROGNOSTIC) -> Path:
    """anemo-infer's own layout: variables by name on (time, values), latitude/longitude along values."""
    values = states(store, list(dates), names)
    data = {name: (("time", "values"), values[:, v]) for v, name in enumerate(names)}
    coords = {
        "time": np.array(dates, dtype="datetime64[ns]"),
        "latitude": ("values", store.latitudes),
        "longitude": ("values", store.longitudes),
    }
    xr.Dataset(data, coords=coords).to_netcdf(path)
    return path


def write_netcdf_levels(path: Path, store: AnemoiZarr, date: np.datetime64) -> Path:
    """A CF layout: one time (a scalar valid_time), parameters t, u, v, z on pressure levels ``plev`` in Pa (the
    levels the model does not use hold zeros), fields on a 2-D latitude x longitude grid, latitudes south to north."""
    values = states(store, [date])[0].reshape(len(PROGNOSTIC), 32, 64)[:, ::-1]  # (V, lat south-north, lon)
    by_name = dict(zip(PROGNOSTIC, values, strict=True))
    levels = [250, 500, 850]
    data = {"sp": (("latitude", "longitude"), by_name["sp"])}
    for param in ("t", "u", "v", "z"):
        fields = [by_name.get(f"{param}_{level}", np.zeros_like(by_name["sp"])) for level in levels]
        data[param] = (("plev", "latitude", "longitude"), np.stack(fields))
    coords = {
        "valid_time": np.datetime64(date, "ns"),
        "plev": ("plev", np.array(levels) * 100.0, {"units": "Pa"}),
        "latitude": np.sort(np.unique(store.latitudes)),
        "longitude": np.unique(store.longitudes),
    }
    xr.Dataset(data, coords=coords).to_netcdf(path)
    return path

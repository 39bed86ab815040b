"""Initial states read in their own units: a netCDF file in °C, geopotential height and hPa gives the forecast of the
same states in K, m² s⁻² and Pa; a GRIB forecast read back as an initial state equals the original within the
packing precision; units that cannot be converted are refused by variable and unit; a file without units is read
as it is (test_file_inputs.py). GRIB output in its parameters' units: a model in °C, gpm and hPa written in K,
m² s⁻² and Pa (an ensemble's spread without the offset); a unit that does not convert refused at set-up."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr
from file_input_helpers import GRIB_KEYS, HISTORY, INIT, states
from inference_helpers import documented, infer_config, setup_error
from test_grib_output import KEYS, messages

from anemo_like.config.inference import GribConfig
from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.grids import regular_grid
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.grib_output import grib_plan, write_grib
from anemo_like.inference.output import forecast_dataset, open_forecast
from anemo_like.inference.run import prepare, run_inference
from anemo_like.inference.units import STANDARD_GRAVITY, to_model_units

pytest.importorskip("eccodes")
# the file's unit and how a value in the model's unit (K, m2 s-2, Pa) is written in it
OTHER_UNITS = {
    "t_850": ("degC", lambda k: k - 273.15),
    "z_500": ("m", lambda phi: phi / STANDARD_GRAVITY),
    "sp": ("hPa", lambda pa: pa / 100.0),
}


def netcdf_in(path, store, units: dict) -> object:
    """The built-in dataset's states at HISTORY and INIT, each variable in ``units`` (name -> (unit, convert))."""
    values = states(store, [HISTORY, INIT])
    data = {}
    for v, name in enumerate(PROGNOSTIC):
        unit, convert = units.get(name, (None, lambda x: x))
        attrs = {} if unit is None else {"units": unit}
        data[name] = (("time", "values"), convert(values[:, v].astype(np.float64)).astype(np.float32), attrs)
    coords = {"time": np.array([HISTORY, INIT], "datetime64[ns]"), "latitude": ("values", store.latitudes),
              "longitude": ("values", store.longitudes)}  # fmt: skip
    xr.Dataset(data, coords=coords).to_netcdf(path)
    return path


def test_a_netcdf_in_other_units_gives_the_forecast_of_the_same_states(skilled, builtin, tmp_path) -> None:
    store = open_anemoi_zarr(builtin)
    outputs = {}
    for label, units in (("model", {}), ("other", OTHER_UNITS)):
        netcdf = netcdf_in(tmp_path / f"{label}.nc", store, units)
        prepared = prepare(
            infer_config(skilled, f"input={netcdf}", f"dates=[{INIT}]", f"output={tmp_path}/p{label}.nc")
        )
        read = prepared.inputs.store.read(slice(0, 2), prepared.inputs.store.variable_indices(PROGNOSTIC))
        exact = states(store, [HISTORY, INIT])
        np.testing.assert_allclose(read, exact, rtol=2e-7, atol=0)  # the file's float32 rounding only
        output = tmp_path / f"{label}.nc.out.nc"
        run_inference(infer_config(skilled, f"input={netcdf}", f"dates=[{INIT}]", "lead_time=12h", f"output={output}"))
        with open_forecast(output) as forecast:
            outputs[label] = {name: forecast[name].values for name in PROGNOSTIC}
    for name in PROGNOSTIC:
        model, other = outputs["model"][name], outputs["other"][name]
        assert np.abs(other - model).max() <= 1e-5 * np.abs(model).max(), name


def test_a_grib_forecast_read_back_as_an_initial_state_is_the_forecast(skilled, tmp_path) -> None:
    """anemo-infer's GRIB output (its units from ecCodes' parameter tables) read back as ``input=``: the states equal
    the forecast within the packing precision, (max - min) / (2^bits - 1) per field."""
    grib, netcdf = tmp_path / "f.grib", tmp_path / "f.nc"
    common = [f"dates=[{HISTORY - np.timedelta64(6, 'h')}]", "lead_time=12h", *GRIB_KEYS]
    run_inference(infer_config(skilled, *common, f"output={grib}", "grib.bits_per_value=16"))
    run_inference(infer_config(skilled, *common, f"output={netcdf}"))
    prepared = prepare(infer_config(skilled, f"input={grib}", f"output={tmp_path}/again.nc", *GRIB_KEYS))
    read = prepared.inputs.store.read(slice(0, 2), prepared.inputs.store.variable_indices(PROGNOSTIC))
    with open_forecast(netcdf) as forecast:
        original = np.stack([forecast[name].values[0] for name in PROGNOSTIC], axis=1)  # (steps, V, G)
    span = original.max(axis=-1, keepdims=True) - original.min(axis=-1, keepdims=True)
    assert np.all(np.abs(read - original) <= span / (2**16 - 1) * (1 + 1e-6))


@pytest.mark.parametrize(
    ("unit", "known"),
    [("m s-1", ""), ("furlong", " (a unit anemo-infer does not know)")],
)
def test_units_that_cannot_be_converted_are_refused_by_variable_and_unit(skilled, builtin, tmp_path, unit, known):
    store = open_anemoi_zarr(builtin)
    netcdf = netcdf_in(tmp_path / "bad.nc", store, {"t_850": (unit, lambda x: x)})
    message = setup_error(infer_config(skilled, f"input={netcdf}", f"output={tmp_path}/x.nc"))
    assert message == (
        f"input {netcdf}: t_850 is in '{unit}'{known} and the model reads it in 'K': convert it to K, or correct its "
        "units attribute"
    )
    documented(message, FILE=netcdf)
    assert not (tmp_path / "x.nc").exists()


def test_unit_spellings_and_conversions() -> None:
    values = np.array([250.0, 300.0], np.float32)
    assert np.array_equal(to_model_units(values, "t_850", "K", "K", "f"), values)
    np.testing.assert_allclose(to_model_units(values - 273.15, "t_850", "°C", "K", "f"), values, rtol=1e-6)
    np.testing.assert_allclose(to_model_units(np.float32([500.0]), "z", "gpm", "m**2 s**-2", "f"), [4903.325])
    np.testing.assert_allclose(to_model_units(np.float32([1000.0]), "sp", "mbar", "Pa", "f"), [1.0e5])
    np.testing.assert_allclose(to_model_units(np.float32([10.0]), "u", "knots", "m/s", "f"), [5.144444], rtol=1e-6)
    assert to_model_units(values, "q", None, "kg kg-1", "f") is values  # no unit in the file: read as it is


MODEL_UNITS = {"t_850": ("degC", 1.0, 273.15), "z_500": ("gpm", STANDARD_GRAVITY, 0.0), "sp": ("hPa", 100.0, 0.0)}


def test_grib_output_is_in_each_parameters_unit(tmp_path) -> None:
    """A model trained in °C, gpm and hPa: its GRIB members and mean in K, m² s⁻² and Pa, its spread scaled only."""
    grid, names = regular_grid(8, 16), list(MODEL_UNITS)
    plan = grib_plan(tmp_path / "f.grib", keys={name: KEYS[name] for name in names}, latitudes=grid.latitudes,
                     longitudes=grid.longitudes, grib=GribConfig(bits_per_value=24), members=3, ensemble_stats=True,
                     model_units={name: unit for name, (unit, _, _) in MODEL_UNITS.items()})  # fmt: skip
    assert plan.units == {"t_850": ("degC", "K"), "z_500": ("gpm", "m**2 s**-2"), "sp": ("hPa", "Pa")}
    centre = np.array([[10.0, 5500.0, 1000.0]])  # (1, V) in the model's units
    fields = centre + np.random.default_rng(0).normal(size=(1, 3, 2, grid.latitudes.size, 3)) * centre / 100
    inputs = SimpleNamespace(
        store=SimpleNamespace(latitudes=grid.latitudes, longitudes=grid.longitudes, attrs={}, path="x"),
        roles=SimpleNamespace(output=names, prognostic=names), steps=2, step=np.timedelta64(6, "h").item(),
        init_dates=np.array(["2000-01-01T00"], dtype="datetime64[s]"),
    )  # fmt: skip
    dataset = forecast_dataset(fields.astype(np.float32), inputs, checkpoint=Path("x.pt"), precision="fp32",
                               ensemble_stats=True)  # fmt: skip
    write_grib(dataset, plan)
    for message in messages(plan.path):
        name = {"t": "t_850", "z": "z_500", "sp": "sp"}[message["shortName"]]
        _, scale, offset = MODEL_UNITS[name]
        lead = message["step"] // 6 - 1
        written = _written(dataset, name, message["type"], message.get("number", 1) - 1, lead)
        expected = written.astype(np.float64) * scale + (offset if message["type"] != "es" else 0.0)
        np.testing.assert_allclose(message["values"], expected, rtol=1e-5, atol=1e-4, err_msg=str(message["type"]))


def _written(dataset: xr.Dataset, name: str, kind: str, member: int, lead: int) -> np.ndarray:
    """The field of ``name`` at ``lead`` that a message of type ``kind`` holds, in the model's units (G,)."""
    if kind == "pf":
        return dataset[name].values[0, member, lead]
    return dataset[f"{name}_{'mean' if kind == 'em' else 'spread'}"].values[0, lead]


def test_grib_output_in_a_unit_that_does_not_convert_is_refused(tmp_path) -> None:
    grid = regular_grid(8, 16)
    with pytest.raises(ValueError) as refusal:
        grib_plan(tmp_path / "f.grib", keys={"z_500": KEYS["z_500"]}, latitudes=grid.latitudes,
                  longitudes=grid.longitudes, grib=GribConfig(), members=1, ensemble_stats=False,
                  model_units={"z_500": "K"})  # fmt: skip
    message = str(refusal.value)
    assert message == (
        f"output {tmp_path / 'f.grib'}: z_500 is in 'K' in the model and GRIB parameter z in 'm**2 s**-2', which "
        "anemo-infer cannot convert to: map z_500 to a parameter in K under grib.variables"
    )
    documented(message, OUT=tmp_path / "f.grib")
    assert not (tmp_path / "f.grib").exists()

"""Initial states from GRIB and netCDF files (``input=``): read, forecast and verified like the dataset's states.

GRIB files are written field by field with ecCodes' samples (tests/file_input_helpers.py); the forecasts start from
the session's trained model (conftest.py ``skilled``) and are compared with the forecast from the same states read
from the built-in dataset.
"""

from __future__ import annotations

import numpy as np
import pytest
from file_input_helpers import GRIB_KEYS, HISTORY, INIT, states, write_grib, write_netcdf, write_netcdf_levels
from inference_helpers import infer_config

from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.output import open_forecast
from anemo_like.inference.run import prepare, run, run_inference

pytest.importorskip("eccodes")
LEAD = "lead_time=1d"


def forecast_of(checkpoint, tmp_path, name: str, *overrides: str) -> dict[str, np.ndarray]:
    """The forecast written by anemo-infer with ``overrides``, by variable, (time, step, values) float32."""
    output = tmp_path / f"{name}.nc"
    run_inference(infer_config(checkpoint, LEAD, f"output={output}", *overrides))
    with open_forecast(output) as forecast:
        return {name: forecast[name].values for name in PROGNOSTIC} | {"time": forecast["time"].values}


@pytest.fixture(scope="module")
def from_dataset(skilled, tmp_path_factory) -> dict[str, np.ndarray]:
    """The forecast from INIT read from the built-in dataset."""
    return forecast_of(skilled, tmp_path_factory.mktemp("dataset"), "dataset", f"dates=[{INIT}]")


def test_grib_input_gives_the_dataset_forecast_within_packing_precision(skilled, builtin, from_dataset, tmp_path):
    store = open_anemoi_zarr(builtin)
    grib = write_grib(tmp_path / "analysis.grib", store, bits=24)
    prepared = prepare(infer_config(skilled, f"input={grib}", LEAD, f"output={tmp_path}/f.nc", *GRIB_KEYS))
    assert prepared.inputs.init_dates.tolist() == [INIT]  # no dates: the last time in the file with its history
    exact = states(store, [HISTORY, INIT])  # (T, V, G)
    read = prepared.inputs.store.read(slice(0, 2), prepared.inputs.store.variable_indices(PROGNOSTIC))
    spread = exact.max(axis=-1, keepdims=True) - exact.min(axis=-1, keepdims=True)
    assert np.all(np.abs(read - exact) <= spread / 2**24)  # simple packing: one step of range / 2**bits
    assert not np.array_equal(read, exact)  # the packing did round
    run(prepared)
    with open_forecast(tmp_path / "f.nc") as forecast:
        for name in PROGNOSTIC:  # the rounding carried through 4 steps: ~1e-6 of the field's spread
            truth = from_dataset[name]
            assert np.abs(forecast[name].values - truth).max() <= 1e-4 * truth.std(), name


def test_netcdf_input_gives_the_dataset_forecast_bitwise(skilled, builtin, from_dataset, tmp_path) -> None:
    netcdf = write_netcdf(tmp_path / "analysis.nc", open_anemoi_zarr(builtin))
    forecast = forecast_of(skilled, tmp_path, "from-netcdf", f"input={netcdf}", f"dates=[{INIT}]")
    for name in ["time", *PROGNOSTIC]:
        assert np.array_equal(forecast[name], from_dataset[name]), name
    with open_forecast(tmp_path / "from-netcdf.nc") as written:  # the file names its initial states' source
        assert written.attrs["input"] == str(netcdf) and "dataset" not in written.attrs


def test_a_list_of_files_one_per_time_in_another_layout(skilled, builtin, from_dataset, tmp_path) -> None:
    store = open_anemoi_zarr(builtin)
    files = [write_netcdf_levels(tmp_path / f"{i}.nc", store, date) for i, date in enumerate([INIT, HISTORY])]
    forecast = forecast_of(skilled, tmp_path, "from-files", f"input=[{files[0]},{files[1]}]")
    for name in ["time", *PROGNOSTIC]:
        assert np.array_equal(forecast[name], from_dataset[name]), name


def test_verify_with_file_input_scores_against_the_dataset(skilled, builtin, tmp_path) -> None:
    """The truth is the dataset, unchanged: scores equal those of the same forecast started from the dataset."""
    netcdf = write_netcdf(tmp_path / "analysis.nc", open_anemoi_zarr(builtin))
    common = [f"dates=[{INIT}]", LEAD, "verify=true", "verification.climatology_dates=0"]
    scores = [
        run_inference(infer_config(skilled, *given, f"output={tmp_path}/{name}/f.nc", *common)).verification
        for name, given in (("files", [f"input={netcdf}"]), ("dataset", []))
    ]
    assert scores[0] is not None and scores[0].as_json() == scores[1].as_json()


def test_a_forecast_of_anemo_infer_restarts_a_forecast(skilled, tmp_path) -> None:
    """Its (time, step, values) layout is read at the valid times; the restart continues the first forecast up to
    the float32 rounding of the states written between."""
    first = tmp_path / "first.nc"
    run_inference(
        infer_config(skilled, f"dates=[{HISTORY - np.timedelta64(6, 'h')}]", "lead_time=36h", f"output={first}")
    )
    restart = forecast_of(skilled, tmp_path, "restart", f"input={first}", "date_range.start=" + str(INIT))
    with open_forecast(first) as forecast:
        for name in PROGNOSTIC:
            continued = forecast[name].values[:, 2:]  # the steps after INIT (12 h in)
            assert np.abs(restart[name] - continued).max() <= 1e-4 * continued.std(), name

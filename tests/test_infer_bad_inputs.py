"""anemo-infer's bad inputs (docs/errors.md, "anemo-infer"): each is refused at set-up with one message, checked
word for word against its row, using the session's trained checkpoint (conftest.py ``skilled``)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr
from inference_helpers import (
    config_error,
    documented,
    grid_dataset,
    infer_config,
    run_infer_cli,
    setup_error,
)

from anemo_like.data.builtin import VARIABLES
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.output import netcdf_engine, open_forecast
from anemo_like.inference.run import run_inference


# ------------------------------------------------------------------------------------------------ bad inputs
def test_missing_checkpoint(tmp_path) -> None:
    missing = tmp_path / "inference.pt"
    message = setup_error(infer_config(missing, "dates=[2000-11-01T00]", f"output={tmp_path}/f.nc"), FileNotFoundError)
    assert message == f"inference checkpoint {missing} does not exist"
    documented(message, FILE=missing)


def test_truncated_checkpoint(skilled, tmp_path) -> None:
    cut = tmp_path / "inference.pt"
    cut.write_bytes(skilled.read_bytes()[:5000])
    message = setup_error(infer_config(cut, "dates=[2000-11-01T00]", f"output={tmp_path}/f.nc"))
    assert message == (
        f"{cut} is not a valid inference checkpoint: not a complete torch.save archive (truncated, corrupted or "
        "another kind of file)"
    )
    documented(message, FILE=cut)


def test_training_checkpoint_instead_of_inference_checkpoint(skilled, tmp_path) -> None:
    last = skilled.parent / "checkpoints" / "last.pt"
    message = setup_error(infer_config(last, "dates=[2000-11-01T00]", f"output={tmp_path}/f.nc"))
    assert message == f"{last} is not an anemo_like inference checkpoint (expected format anemo_like-inference-v1)"
    documented(message, FILE=last)


def test_dataset_of_another_grid(skilled, tmp_path) -> None:
    lat, lon = (a.ravel() for a in np.meshgrid(np.linspace(-78.75, 78.75, 8), np.arange(16) * 22.5, indexing="ij"))
    other = grid_dataset(
        tmp_path / "other.zarr", variables=list(VARIABLES), frequency="6h", num_dates=4, lat=lat, lon=lon
    )
    config = infer_config(skilled, f"dataset={other}", "dates=[2000-01-01T06]", f"output={tmp_path}/f.nc")
    message = setup_error(config)
    assert message == f"dataset {other} does not fit checkpoint {skilled}: its grid has 128 points, the model's 2048"
    documented(message, PATH=other, FILE=skilled)


def test_dataset_lacking_variables_at_another_frequency(skilled, builtin, tmp_path) -> None:
    store = open_anemoi_zarr(builtin)
    names = [n for n in VARIABLES if n not in ("u_250", "v_250")]
    path = grid_dataset(
        tmp_path / "d.zarr", variables=names, frequency="12h", num_dates=4, lat=store.latitudes, lon=store.longitudes
    )
    message = setup_error(infer_config(skilled, f"dataset={path}", "dates=[2000-01-01T12]", f"output={tmp_path}/f.nc"))
    assert message == (
        f"dataset {path} does not fit checkpoint {skilled}: it lacks the variable(s) u_250, v_250; its frequency 12h "
        "does not divide the model step 6h"
    )
    documented(message, PATH=path, FILE=skilled)


def test_dataset_with_other_coordinates(skilled, builtin, tmp_path) -> None:
    store = open_anemoi_zarr(builtin)
    lon = store.longitudes.copy()
    lon[100] += 5.0
    path = grid_dataset(
        tmp_path / "d.zarr", variables=list(VARIABLES), frequency="6h", num_dates=4, lat=store.latitudes, lon=lon
    )
    message = setup_error(infer_config(skilled, f"dataset={path}", "dates=[2000-01-01T06]", f"output={tmp_path}/f.nc"))
    assert message == (
        f"dataset {path} does not fit checkpoint {skilled}: its grid coordinates differ from the model's by up to 5 "
        "degrees (point 100: 81.5625, 207.5 against 81.5625, 202.5)"
    )
    documented(message, PATH=path, FILE=skilled)


@pytest.mark.parametrize(
    "date, expected",
    [
        (
            "2001-06-01T00",
            "initial date 2001-06-01T00:00:00 is outside dataset PATH, which covers 2000-01-01T00:00:00 .. "
            "2000-12-30T18:00:00",
        ),
        (
            "2000-01-01T00",
            "initial date 2000-01-01T00:00:00 lacks input history: the model starts from 2 states 6h apart, but "
            "dataset PATH starts at 2000-01-01T00:00:00; use initial dates from 2000-01-01T06:00:00 on",
        ),
        (
            "2000-11-01T03",
            "initial date 2000-11-01T03:00:00 is not a date of dataset PATH (every 6h from 2000-01-01T00:00:00)",
        ),
    ],
    ids=["outside", "without-history", "between-dates"],
)
def test_initial_date_the_dataset_cannot_start_from(skilled, builtin, tmp_path, date: str, expected: str) -> None:
    message = setup_error(infer_config(skilled, f"dates=[{date}]", f"output={tmp_path}/f.nc"))
    assert message == expected.replace("PATH", str(builtin))
    documented(message, PATH=builtin)


def test_forcing_that_changes_in_time_needed_after_the_dataset(skilled, builtin, tmp_path) -> None:
    store = open_anemoi_zarr(builtin)
    path = grid_dataset(
        tmp_path / "d.zarr",
        variables=list(VARIABLES),
        frequency="6h",
        num_dates=8,
        lat=store.latitudes,
        lon=store.longitudes,
    )
    config = infer_config(
        skilled, f"dataset={path}", "dates=[2000-01-02T18]", "lead_time=1d", f"output={tmp_path}/f.nc"
    )
    message = setup_error(config)
    assert message == (
        f"initial date 2000-01-02T18:00:00 with lead_time 1d needs the forcing(s) cos_latitude, sin_latitude, "
        f"cos_longitude, sin_longitude until 2000-01-03T12:00:00, after the last date 2000-01-02T18:00:00 of dataset "
        f"{path} (only forcings constant in time are held beyond it); choose an earlier initial date or a shorter "
        "lead_time"
    )
    documented(message, PATH=path)


def test_lead_time_not_a_multiple_of_the_model_step(skilled, tmp_path) -> None:
    message = setup_error(infer_config(skilled, "dates=[2000-11-01T00]", "lead_time=5h", f"output={tmp_path}/f.nc"))
    assert message == f"lead_time '5h' is not a multiple of the model step 6h of checkpoint {skilled}"
    documented(message, FILE=skilled)


def test_output_that_cannot_be_written(skilled, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    output = blocker / "forecasts" / "f.nc"
    message = setup_error(infer_config(skilled, "dates=[2000-11-01T00]", f"output={output}"))
    assert message == (
        f"output {output} cannot be written (Not a directory); choose a path in a folder you can write (output=...)"
    )
    documented(message, OUT=output)


def test_output_replaces_only_a_forecast_anemo_infer_wrote(skilled, builtin, tmp_path) -> None:
    """The path may hold an earlier forecast of ours (replaced); anything else is refused and left alone."""
    lat, lon = (a.ravel() for a in np.meshgrid(np.linspace(-78.75, 78.75, 8), np.arange(16) * 22.5, indexing="ij"))
    other_dataset = grid_dataset(tmp_path / "era.zarr", variables=["t"], frequency="6h", num_dates=2, lat=lat, lon=lon)
    foreign = xr.Dataset({"t": ("x", np.arange(3.0))}, attrs={"title": "someone's analysis"})
    foreign.to_zarr(tmp_path / "foreign.zarr", zarr_format=2)
    foreign.to_netcdf(tmp_path / "foreign.nc", engine=netcdf_engine())
    (tmp_path / "notes.nc").write_text("not netCDF")
    (tmp_path / "folder.zarr").mkdir()
    (tmp_path / "file.zarr").write_text("")
    (tmp_path / "link.zarr").symlink_to(builtin)
    holds = {
        builtin: "an anemoi-datasets dataset",  # the input dataset itself
        other_dataset: "an anemoi-datasets dataset",
        tmp_path / "foreign.zarr": "a zarr store not written by anemo-infer",
        tmp_path / "foreign.nc": "a netCDF file not written by anemo-infer",
        tmp_path / "notes.nc": "a file that is not a forecast of anemo-infer",
        tmp_path / "folder.zarr": "a folder that is not a zarr store",
        tmp_path / "file.zarr": "a file that is not a forecast of anemo-infer",
        tmp_path / "link.zarr": "a symbolic link",
    }
    for output, what in holds.items():
        message = setup_error(infer_config(skilled, "dates=[2000-11-01T00]", f"output={output}"))
        assert message == (
            f"output {output} holds {what}; anemo-infer only replaces a forecast it wrote itself: "
            "remove it yourself or choose another path (output=...)"
        )
        documented(message, OUT=output)
    inside = builtin / "forecast.zarr"
    message = setup_error(infer_config(skilled, "dates=[2000-11-01T00]", f"output={inside}"))
    assert message == f"output {inside} lies inside the zarr store {builtin}; choose a path outside it (output=...)"
    documented(message, OUT=inside, PATH=builtin)
    for name in ("again.zarr", "again.nc"):  # an earlier forecast of ours is replaced, in either format
        for lead in ("6h", "12h"):
            run_inference(
                infer_config(skilled, "dates=[2000-11-01T00]", f"lead_time={lead}", f"output={tmp_path / name}")
            )
        with open_forecast(tmp_path / name) as forecast:
            assert forecast.sizes["step"] == 2


def test_cli_leaves_the_input_dataset_byte_identical_when_asked_to_write_over_it(skilled, builtin, tmp_path) -> None:
    dataset = shutil.copytree(builtin, tmp_path / "input.zarr")

    def contents() -> dict[str, bytes]:
        return {str(f.relative_to(dataset)): f.read_bytes() for f in sorted(dataset.rglob("*")) if f.is_file()}

    before = contents()
    args = [f"checkpoint={skilled}", f"dataset={dataset}", f"output={dataset}", "dates=[2000-11-01T00]"]
    result = run_infer_cli(args, tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert f"output {dataset} holds an anemoi-datasets dataset" in result.stdout + result.stderr
    assert contents() == before and not any(p.name.startswith(".input.zarr") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (
            ["dates=[2000-11-01T00]", "output=forecast.csv"],
            "config key 'output' = 'forecast.csv': the suffix picks the format: end the path in .nc, .zarr, .grib, "
            ".grib2, .grb, .grb2",
        ),
        (["output=f.nc"], "no initial dates: set dates=[...] or date_range.start=..."),
        (
            ["dates=[2000-11-31]", "output=f.nc"],
            "config key 'dates' = ['2000-11-31']: cannot parse date '2000-11-31'; expected ISO 8601 like 2000-11-01T06",
        ),
        (
            ["lead_tme=5d"],
            "unknown config key 'lead_tme' (did you mean 'lead_time'?); allowed here: checkpoint, dataset, input, "
            "boundary, dates, date_range, lead_time, output, grib, batch_size, members, seed, ensemble_stats, device, "
            "precision, num_threads, cuda_graphs, memory_budget_gb, num_gpus_per_model, collective_timeout_minutes, "
            "verify, verification",
        ),
    ],
    ids=["output-suffix", "no-dates", "bad-date", "misspelled-key"],
)
def test_config_errors(skilled, overrides: list[str], expected: str) -> None:
    message = config_error(skilled, *overrides)
    assert message == expected
    documented(message)

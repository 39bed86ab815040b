"""anemo-infer: forecasts from a trained inference checkpoint, written with xarray, verified against the dataset.

Two tiny quickstart models are trained once for the module: one for 400 steps (long enough to beat 6 h
persistence on the built-in dataset) and one for 2 steps with a diagnostic variable and computed forcings (for
the feed-back mechanics). Bad inputs are checked word for word against their rows in docs/errors.md.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
import zarr
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import anemo_like
from anemo_like.config import ConfigError
from anemo_like.config.inference import (
    InferenceConfig,
    check_inference_override_keys,
    inference_config_dir,
    validate_inference_config,
)
from anemo_like.data.builtin import UNITS, VARIABLES, ensure_builtin_dataset
from anemo_like.data.forcings import computed_forcings
from anemo_like.data.zarr_store import open_anemoi_zarr, write_anemoi_zarr
from anemo_like.inference import load_inference_checkpoint
from anemo_like.inference.output import netcdf_engine, open_forecast
from anemo_like.inference.run import InferenceOutputs, prepare, run_inference
from anemo_like.models import edge_features
from anemo_like.models.ops.chunking import DestinationChunk, SortedEdges, plan_destination_chunks
from anemo_like.training.trainer import Trainer

ERRORS_DOC = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
SKILL_TRAINING = [
    "training.max_steps=400",
    "training.val_every_n_steps=400",
    "training.checkpoint_every_n_steps=400",
    "training.optimizer.warmup_steps=10",
    "training.val_climatology_dates=0",
    "dataloader.limit_batches.val=1",
    "diagnostics.plots=false",
]
MIXED_ROLES = [
    "data.variables.prognostic=[t_850,u_250,u_850,v_250,v_850,z_500]",
    "data.variables.diagnostic=[sp]",
    "data.variables.computed_forcing=[cos_julian_day,sin_local_time]",
    "training.max_steps=2",
    "training.val_climatology_dates=0",
    "dataloader.limit_batches.val=1",
    "diagnostics.plots=false",
]
# 15 initial dates, 2000-11-01 .. 2000-12-27 every 4 days; the last forecast runs past the dataset's end (12-30T18)
INITIAL_DATES = ["date_range.start=2000-11-01T00", "date_range.end=2000-12-27T00", "date_range.every=4d"]
INITS = np.datetime64("2000-11-01T00", "s") + np.arange(15) * np.timedelta64(4, "D")
TRAIN_END = np.datetime64("2000-11-01T00", "s")  # the quickstart training split ends just before


def run_infer_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m anemo_like.cli.infer ARGS`` in ``tmp_path`` (its Hydra folder ``tmp_path/run``), output captured."""
    command = [sys.executable, "-m", "anemo_like.cli.infer", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)


def infer_config(checkpoint: Path, *overrides: str) -> InferenceConfig:
    """The default inference config with ``overrides``, checked, composed and validated as on the command line."""
    arguments = [f"checkpoint={checkpoint}", *overrides]
    check_inference_override_keys(arguments)
    with initialize_config_dir(config_dir=str(inference_config_dir()), version_base="1.3"):
        cfg = compose(config_name="default", overrides=arguments)
    return validate_inference_config(OmegaConf.to_container(cfg, resolve=True))


def documented(message: str, **placeholders: Path) -> None:
    """``message``, with each path replaced by its placeholder name, is a row of docs/errors.md, word for word."""
    for name, path in placeholders.items():
        message = message.replace(str(path), name)
    assert f"`{message}`" in ERRORS_DOC, f"not in docs/errors.md:\n{message}"


def setup_error(config: InferenceConfig, error: type[Exception] = ValueError) -> str:
    with pytest.raises(error) as info:
        prepare(config)
    return str(info.value)


def config_error(checkpoint: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        infer_config(checkpoint, *overrides)
    message = str(info.value)
    assert message.startswith("invalid configuration:\n  ")
    return message.removeprefix("invalid configuration:\n  ")


def grid_dataset(path: Path, *, variables: list[str], frequency: str, num_dates: int, lat, lon) -> Path:
    """Random data on the grid (lat, lon), without variables_metadata (no forcing is marked constant)."""
    data = np.random.default_rng(0).normal(size=(num_dates, len(variables), 1, len(lat)))
    step = np.timedelta64(int(frequency.removesuffix("h")), "h")
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(num_dates) * step
    return write_anemoi_zarr(
        path, data=data, variables=variables, dates=dates, latitudes=lat, longitudes=lon, frequency=frequency
    )


# ------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def builtin(cache_dir) -> Path:
    return ensure_builtin_dataset(cache_dir)


@pytest.fixture(scope="module")
def skilled(tmp_path_factory, compose_run) -> Path:
    """inference.pt of the quickstart model, tiny size, trained 400 steps."""
    run_dir = tmp_path_factory.mktemp("skilled")
    Trainer(compose_run(run_dir, SKILL_TRAINING)).fit()
    return run_dir / "inference.pt"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, compose_run) -> Path:
    """inference.pt of a 2-step quickstart model with a diagnostic variable (sp) and two computed forcings."""
    run_dir = tmp_path_factory.mktemp("mixed")
    Trainer(compose_run(run_dir, MIXED_ROLES)).fit()
    return run_dir / "inference.pt"


@pytest.fixture(scope="module")
def verified(skilled, tmp_path_factory) -> InferenceOutputs:
    """The 15 verified 5-day forecasts of INITIAL_DATES, as netCDF."""
    out = tmp_path_factory.mktemp("forecast")
    return run_inference(infer_config(skilled, *INITIAL_DATES, f"output={out / 'forecast.nc'}", "verify=true"))


# -------------------------------------------------------------------------------------------- the forecast
def test_forecast_file_is_cf_style_with_steps_coordinates_and_units(verified, skilled, builtin) -> None:
    store = open_anemoi_zarr(builtin)
    with xr.open_dataset(verified.forecast) as ds:
        assert list(ds.data_vars) == list(UNITS)  # the quickstart's output variables, in order
        assert dict(ds.sizes) == {"time": 15, "step": 20, "values": 2048}
        np.testing.assert_array_equal(ds["time"].values, INITS)
        np.testing.assert_array_equal(ds["step"].values, np.arange(1, 21) * np.timedelta64(6, "h"))
        assert ds["valid_time"].values[-1, -1] == np.datetime64("2001-01-01T00")
        np.testing.assert_array_equal(ds["latitude"].values, store.latitudes)
        np.testing.assert_array_equal(ds["longitude"].values, store.longitudes)
        assert ds["latitude"].attrs["units"] == "degrees_north" and ds["longitude"].attrs["units"] == "degrees_east"
        for name, units in UNITS.items():
            assert ds[name].dims == ("time", "step", "values") and ds[name].dtype == np.float32
            assert ds[name].attrs["units"] == units
            assert np.isfinite(ds[name].values).all()
        assert ds.attrs["checkpoint"] == str(skilled) and ds.attrs["package_version"] == anemo_like.__version__


def step_by_step(
    checkpoint: Path, dataset: Path, init: np.datetime64, steps: int, dtype: torch.dtype = torch.float32
) -> np.ndarray:
    """The model called by hand, step by step, in ``dtype``: (steps, G, V_out) physical units, float64. Inputs read
    with zarr directly (fp32; fed-back states too)."""
    bundle = load_inference_checkpoint(checkpoint)
    bundle.model.to(dtype)
    roles, norm = bundle.roles, bundle.normalizer
    group = zarr.open_group(dataset, mode="r")
    names, dates, lon = list(group.attrs["variables"]), group["dates"][:], group["longitudes"][:]
    read = roles.prognostic + roles.forcing
    offset = norm.offset[[norm.names.index(n) for n in read]][:, None]
    scale = norm.scale[[norm.names.index(n) for n in read]][:, None]
    out = [norm.names.index(n) for n in roles.output]

    def state(t: int, prognostic: np.ndarray | None = None) -> np.ndarray:  # (G, V_in) normalised
        values = ((group["data"][t, [names.index(n) for n in read], 0] - offset) / scale).astype(np.float32)
        if prognostic is not None:
            values[: len(roles.prognostic)] = prognostic
        return np.concatenate([values, computed_forcings(roles.computed, dates[t : t + 1], lon)[0]]).T

    i = int(np.searchsorted(dates, init))
    window, forecast = [state(i - 1), state(i)], []
    with torch.no_grad():
        for k in range(steps):
            prediction = bundle.model(torch.from_numpy(np.stack(window))[None].to(dtype))[0].double().numpy()
            forecast.append(prediction * norm.scale[out] + norm.offset[out])
            window = [window[1], state(i + k + 1, prognostic=prediction[:, : len(roles.prognostic)].T)]
    return np.stack(forecast)


@pytest.mark.equivalence
def test_first_step_is_the_models_prediction_and_fed_back_states_match_step_by_step(mixed, builtin, tmp_path):
    inits = ["2000-11-03T06", "2000-11-20T12"]
    dates, verify = f"dates=[{','.join(inits)}]", ["verify=true", "verification.climatology_dates=4"]
    outputs = run_inference(
        infer_config(mixed, dates, "lead_time=1d", "batch_size=2", f"output={tmp_path}/f.zarr", *verify)
    )
    bundle = load_inference_checkpoint(mixed)
    roles = bundle.roles
    scale = bundle.normalizer.scale[[bundle.normalizer.names.index(name) for name in roles.output]]
    with xr.open_zarr(outputs.forecast) as ds:
        assert sorted(ds.data_vars) == sorted(roles.output) and ds["sp"].attrs["role"] == "diagnostic"
        for n, init in enumerate(inits):
            expected = step_by_step(mixed, builtin, np.datetime64(init, "s"), steps=4)
            got = np.stack([ds[name].isel(time=n).values for name in roles.output], axis=-1)  # (L, G, V)
            difference = np.abs(got - expected) / scale  # normalised units; batch 2 against 1: other BLAS blocking
            assert difference[0].max() <= FIRST_STEP_ATOL, f"first step: {difference[0].max()}"
            for lead in range(2, 5):
                assert difference[lead - 1].max() <= feedback_atol(lead), f"lead {lead}: {difference[lead - 1].max()}"
    rows = [row.strip("| ").split(" | ") for row in (tmp_path / "verification.md").read_text().splitlines()]
    sp = next(row for row in rows if row[:3] == ["sp", "6h", "2"])
    assert sp[6:9] == ["n/a"] * 3 and sp[-1] == "n/a", sp  # a diagnostic variable has no persistence baseline
    assert outputs.verification.variables == roles.output
    assert np.isfinite(outputs.verification.rmse["persistence"][:, :6]).all()


# fp32 rounding of one 20-step rollout, measured as the largest |fp32 - fp64| of the same rollout (normalised units,
# over variables, points and the initial dates 2000-11-01T00 and -05T00; torch 2.13 CPU, x86, threads 1, 2 and 4):
# 7e-7 at lead 1, 3.4e-6 at lead 3, 1.0e-5 at lead 12, 3.3e-5 at lead 20 -- about linear in the lead, at most 1.7e-6
# per lead. The bound below leaves a factor 1.8 for other CPUs and BLAS builds; the test after this block checks it.
ROUNDING_PER_LEAD = 3e-6
FIRST_STEP_ATOL = 1e-5  # one forward pass, chunked against whole, normalised units


def feedback_atol(lead: int) -> float:
    """Bound on |chunked - whole| at ``lead`` (1-based), normalised units: each rollout is within
    ROUNDING_PER_LEAD * lead of the exact one, in its own way (reduction order, BLAS blocking), so their difference
    is within twice that. (Here the two agree to the bit; a 2-thread machine once gave 1.1e-5 at lead 19.)"""
    return 2 * ROUNDING_PER_LEAD * lead


@pytest.mark.equivalence
def test_fp32_rollout_rounding_grows_within_the_bound_the_chunking_test_assumes(skilled, builtin) -> None:
    bundle = load_inference_checkpoint(skilled)
    scale = bundle.normalizer.scale[[bundle.normalizer.names.index(n) for n in bundle.roles.output]]
    for init in ("2000-11-01T00", "2000-11-05T00"):
        date = np.datetime64(init, "s")
        single, double = (step_by_step(skilled, builtin, date, 20, dtype) for dtype in (torch.float32, torch.float64))
        worst = (np.abs(single - double) / scale).max(axis=(1, 2))  # (L,)
        bound = ROUNDING_PER_LEAD * np.arange(1, 21)
        assert (worst <= bound).all(), f"{init}: |fp32 - fp64| by lead {worst} beyond {bound}"


def chunked_forecast(skilled: Path, output: Path, monkeypatch) -> InferenceOutputs:
    monkeypatch.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER", "8")
    monkeypatch.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR", "4")
    return run_inference(infer_config(skilled, "dates=[2000-11-01T00,2000-11-05T00]", f"output={output}"))


def normalised_differences(skilled: Path, chunked: Path, whole: Path) -> np.ndarray:
    """Largest |chunked - whole| per lead over variables, points and dates, normalised units: (L,)."""
    bundle = load_inference_checkpoint(skilled)
    worst = np.zeros(0)
    with xr.open_dataset(whole) as expected, xr.open_dataset(chunked) as got:
        for name in bundle.roles.output:
            scale = bundle.normalizer.scale[bundle.normalizer.names.index(name)]
            difference = np.abs(got[name].values - expected[name].isel(time=slice(0, 2)).values) / scale  # (N, L, G)
            worst = np.maximum(worst, difference.max(axis=(0, 2))) if worst.size else difference.max(axis=(0, 2))
    return worst


def assert_first_step_equal(worst: np.ndarray) -> None:
    assert worst[0] <= FIRST_STEP_ATOL, f"lead 1: |chunked - whole| = {worst[0]:.3g} > {FIRST_STEP_ATOL}"


def assert_feedback_within_rounding(worst: np.ndarray) -> None:
    bound = np.array([feedback_atol(lead) for lead in range(1, len(worst) + 1)])
    beyond = np.flatnonzero(worst[1:] > bound[1:]) + 1
    assert beyond.size == 0, f"leads {(beyond + 1).tolist()}: {worst[beyond]} beyond {bound[beyond]}"


@pytest.mark.equivalence
def test_inference_chunking_does_not_change_the_forecast(skilled, verified, tmp_path, monkeypatch) -> None:
    chunked = chunked_forecast(skilled, tmp_path / "c.nc", monkeypatch)
    worst = normalised_differences(skilled, chunked.forecast, verified.forecast)
    assert_first_step_equal(worst)
    assert_feedback_within_rounding(worst)


@pytest.mark.equivalence
def test_the_chunking_comparisons_catch_one_edge_dropped_from_one_chunk(skilled, verified, tmp_path, monkeypatch):
    """A test of the test: without one edge of the second mapper chunk, both comparisons above fail."""

    def plan_without_one_edge(edges: SortedEdges, num_chunks: int) -> list[DestinationChunk]:
        chunks = plan_destination_chunks(edges, num_chunks)
        if num_chunks > 1:  # the inference chunk count; the whole forecast's plans stay intact
            chunk = chunks[1]
            kept = torch.stack([chunk.edges.src[:-1], chunk.edges.dst[:-1]])
            chunks[1] = dataclasses.replace(
                chunk, edge_stop=chunk.edge_stop - 1, edges=SortedEdges(kept, chunk.edges.num_dst)
            )
        return chunks

    monkeypatch.setattr(edge_features, "plan_destination_chunks", plan_without_one_edge)
    faulty = chunked_forecast(skilled, tmp_path / "faulty.nc", monkeypatch)
    worst = normalised_differences(skilled, faulty.forecast, verified.forecast)
    with pytest.raises(AssertionError, match="lead 1"):
        assert_first_step_equal(worst)
    with pytest.raises(AssertionError, match="beyond"):
        assert_feedback_within_rounding(worst)


# ----------------------------------------------------------------------------------------------- verification
def test_verification_table_equals_an_independent_numpy_computation(verified, skilled, builtin) -> None:
    group = zarr.open_group(builtin, mode="r")
    names, dates = list(group.attrs["variables"]), group["dates"][:]
    columns = [names.index(name) for name in UNITS]
    truth_at = {d: group["data"][i, columns, 0].T.astype(np.float64) for i, d in enumerate(dates) if d >= INITS[0]}
    weight = load_inference_checkpoint(skilled).graph["data"].area_weight.double().numpy()
    weight /= weight.sum()
    train_stop = int(np.searchsorted(dates, TRAIN_END))
    every = np.unique(np.linspace(0, train_stop - 1, 365).round().astype(int))
    climatology = np.mean([group["data"][i, columns, 0].T.astype(np.float64) for i in every.tolist()], axis=0)  # (G, V)
    squared = {k: np.zeros((20, 7)) for k in ("model", "persistence", "climatology")}
    linear = {k: np.zeros((20, 7)) for k in squared}
    absolute = {k: np.zeros((20, 7)) for k in squared}
    count = np.zeros(20)
    with xr.open_dataset(verified.forecast) as ds:
        forecast = np.stack([ds[name].values for name in UNITS], axis=-1).astype(np.float64)  # (N, L, G, V)
    for n, init in enumerate(INITS):
        for lead in range(20):
            valid = init + (lead + 1) * np.timedelta64(6, "h")
            if valid not in truth_at:
                continue
            count[lead] += 1
            for kind, guess in (
                ("model", forecast[n, lead]),
                ("persistence", truth_at[init]),
                ("climatology", climatology),
            ):
                squared[kind][lead] += weight @ (guess - truth_at[valid]) ** 2
                linear[kind][lead] += weight @ (guess - truth_at[valid])
                absolute[kind][lead] += weight @ np.abs(guess - truth_at[valid])
    result = verified.verification
    assert result.forecasts == count.astype(int).tolist() and count[0] == 15 and count[-1] == 14
    for kind in squared:
        np.testing.assert_allclose(result.rmse[kind], np.sqrt(squared[kind] / count[:, None]), rtol=1e-6)
        np.testing.assert_allclose(result.bias[kind], linear[kind] / count[:, None], rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(result.mae[kind], absolute[kind] / count[:, None], rtol=1e-6)
    rmse = {kind: np.sqrt(squared[kind][0, 1] / 15) for kind in squared}  # t_850 at 6 h
    mae = {kind: absolute[kind][0, 1] / 15 for kind in squared}
    bias = {kind: linear[kind][0, 1] / 15 for kind in squared}
    cells = [f"{rmse[k]:.4g} | {mae[k]:.4g} | {bias[k]:.4g}" for k in ("model", "persistence", "climatology")]
    row = f"| t_850 | 6h | 15 | {' | '.join(cells)} | {rmse['model'] / rmse['persistence']:.3f} |"
    folder = verified.verification_output
    assert row in (folder / "verification.md").read_text().splitlines()
    assert (folder / "rmse_by_lead.png").stat().st_size > 0 and (folder / "forecast_map.png").stat().st_size > 0


def test_model_trained_400_steps_beats_persistence_at_6h(verified) -> None:
    result = verified.verification
    prognostic = result.num_prognostic
    assert result.leads[0] == "6h" and prognostic == 7
    model, persistence = result.rmse["model"][0, :prognostic], result.rmse["persistence"][0, :prognostic]
    ratios = dict(zip(result.variables, np.round(model / persistence, 3), strict=False))
    assert (model < persistence).all(), f"model / persistence RMSE at 6 h: {ratios}"


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
            "config key 'output' = 'forecast.csv': the suffix picks the format: end the path in .nc or .zarr",
        ),
        (["output=f.nc"], "no initial dates: set dates=[...] or date_range.start=..."),
        (
            ["dates=[2000-11-31]", "output=f.nc"],
            "config key 'dates' = ['2000-11-31']: cannot parse date '2000-11-31'; expected ISO 8601 like 2000-11-01T06",
        ),
        (
            ["lead_tme=5d"],
            "unknown config key 'lead_tme' (did you mean 'lead_time'?); allowed here: checkpoint, dataset, dates, "
            "date_range, lead_time, output, batch_size, members, seed, ensemble_stats, device, precision, "
            "num_threads, memory_budget_gb, num_gpus_per_model, collective_timeout_minutes, verify, verification",
        ),
    ],
    ids=["output-suffix", "no-dates", "bad-date", "misspelled-key"],
)
def test_config_errors(skilled, overrides: list[str], expected: str) -> None:
    message = config_error(skilled, *overrides)
    assert message == expected
    documented(message)


# ------------------------------------------------------------------------------------------------------- CLI
def test_cli_writes_zarr_and_stops_bad_inputs_with_one_message(skilled, verified, builtin, tmp_path) -> None:
    lat, lon = (a.ravel() for a in np.meshgrid(np.linspace(-78.75, 78.75, 8), np.arange(16) * 22.5, indexing="ij"))
    other = grid_dataset(
        tmp_path / "other.zarr", variables=list(VARIABLES), frequency="6h", num_dates=4, lat=lat, lon=lon
    )
    common = [f"checkpoint={skilled}", "dates=[2000-12-27T00]"]
    cases = {
        "forecast": (
            [*common, f"output={tmp_path}/cli.zarr", "verify=true", "verification.climatology_dates=0"],
            0,
            "anemo-infer: 1 forecast(s) x 20 steps in ",
        ),
        "wrong dataset": ([*common, f"dataset={other}", f"output={tmp_path}/x.nc"], 2, "does not fit checkpoint"),
        "config": ([*common, "output=forecast.csv"], 2, "the suffix picks the format"),
    }
    started = {
        name: subprocess.Popen(
            [sys.executable, "-m", "anemo_like.cli.infer", *args, f"hydra.run.dir={tmp_path / name.replace(' ', '-')}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name, (args, _, _) in cases.items()
    }
    outputs = {}
    for name, process in started.items():
        output = outputs[name] = process.communicate(timeout=180)[0]
        _, code, expected = cases[name]
        assert process.returncode == code, f"{name}:\n{output}"
        assert expected in output and "Traceback" not in output, f"{name}:\n{output}"
    assert "they are not scored" in outputs["forecast"]  # valid times after 2000-12-30T18
    summary = re.search(
        r"peak memory (\d+) MiB \(forecasts: \+(-?\d+) MiB above the loaded model\)", outputs["forecast"]
    )
    assert summary and 0 <= int(summary[2]) < int(summary[1]), outputs["forecast"]
    with xr.open_zarr(tmp_path / "cli.zarr") as cli, xr.open_dataset(verified.forecast) as ref:
        for name in UNITS:
            np.testing.assert_allclose(cli[name].isel(time=0).values, ref[name].isel(time=-1).values, rtol=1e-5)
    assert (tmp_path / "verification.md").is_file()

"""anemo-infer: forecasts from a trained inference checkpoint, written with xarray, verified against the dataset.

Two tiny quickstart models are trained once for the session (conftest.py): one for 400 steps (long enough to beat 6 h
persistence on the built-in dataset) and one for 2 steps with a diagnostic variable and computed forcings (for
the feed-back mechanics). Bad inputs: test_infer_bad_inputs.py.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
import zarr
from inference_helpers import (
    INITS,
    TRAIN_END,
    grid_dataset,
    infer_config,
)

import anemo_like
from anemo_like.data.builtin import UNITS, VARIABLES
from anemo_like.data.forcings import computed_forcings
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference import load_inference_checkpoint
from anemo_like.inference.run import InferenceOutputs, run_inference
from anemo_like.models import edge_features
from anemo_like.models.ops.chunking import DestinationChunk, SortedEdges, plan_destination_chunks


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
    names, dates = list(group.attrs["variables"]), group["dates"][:]
    lat, lon = group["latitudes"][:], group["longitudes"][:]
    read = roles.prognostic + roles.forcing
    offset = norm.offset[[norm.names.index(n) for n in read]][:, None]
    scale = norm.scale[[norm.names.index(n) for n in read]][:, None]
    out = [norm.names.index(n) for n in roles.output]

    def state(t: int, prognostic: np.ndarray | None = None) -> np.ndarray:  # (G, V_in) normalised
        values = ((group["data"][t, [names.index(n) for n in read], 0] - offset) / scale).astype(np.float32)
        if prognostic is not None:
            values[: len(roles.prognostic)] = prognostic
        return np.concatenate([values, computed_forcings(roles.computed, dates[t : t + 1], lat, lon)[0]]).T

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

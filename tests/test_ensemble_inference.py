"""anemo-infer members=M: reproducible members from a seed, the ``number`` dimension, the ensemble mean and spread,
probabilistic verification (verification.md, verification.json, rank histograms, spread-skill), the members=1
layout, the error for a deterministic checkpoint, and the members of a sharded model.

Two tiny models of the 8x16 dataset of test_bad_inputs, trained 2 steps: a deterministic one and an ensemble one
(afcrps, 2 members) whose zero-initialised noise modulation is then set at random, so members differ visibly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from bad_input_helpers import TINY_DATA, tiny_dataset
from distributed_checks import free_port
from inference_helpers import config_error, documented, infer_config, run_infer_cli, setup_error
from test_data_parallel import wait_all

from anemo_like.inference import load_inference_checkpoint
from anemo_like.inference.output import open_forecast
from anemo_like.inference.run import InferenceOutputs, run_inference
from anemo_like.training.trainer import Trainer

DATES = "dates=[2000-01-04T00,2000-01-04T12]"
NAMES = ["sp", "t_850", "z_500"]  # the prognostic variables of TINY_DATA, the forecast's outputs
ENSEMBLE = ["training.ensemble.members=2", "training.loss.name=afcrps", "model.noise={channels:4}"]
FAST = ["dataloader.limit_batches.val=1", "training.val_climatology_dates=0"]


def forecast(checkpoint: Path, dataset: Path, output: Path, *overrides: str) -> InferenceOutputs:
    """18 h forecasts from DATES (3 leads), in-process."""
    config = infer_config(checkpoint, f"dataset={dataset}", DATES, "lead_time=18h", f"output={output}", *overrides)
    return run_inference(config)


def members_of(path: Path) -> dict[str, np.ndarray]:
    """Every forecast variable of a file, (N, M, L, G) float32 (M = 1 without a number dimension)."""
    with open_forecast(path) as ds:
        return {
            name: ds[name].transpose("time", "number", "step", "values").values
            if "number" in ds[name].dims
            else ds[name].values[:, None]
            for name in NAMES
        }


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return tiny_dataset(tmp_path_factory.mktemp("data") / "tiny.zarr")


@pytest.fixture(scope="module")
def deterministic(tmp_path_factory, compose_run, dataset) -> Path:
    run_dir = tmp_path_factory.mktemp("deterministic")
    return Trainer(compose_run(run_dir, [f"data.dataset={dataset}", *TINY_DATA, *FAST])).fit().inference_checkpoint


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, compose_run, dataset) -> Path:
    """An ensemble model's inference.pt, its noise modulation (zero after 2 steps) set to N(0, 0.2^2)."""
    run_dir = tmp_path_factory.mktemp("ensemble")
    trained = Trainer(compose_run(run_dir, [f"data.dataset={dataset}", *TINY_DATA, *FAST, *ENSEMBLE])).fit()
    state = torch.load(trained.inference_checkpoint, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    modulated = [key for key in state["state_dict"] if "modulation" in key]
    assert modulated, "the ensemble model has no noise-conditioned norms"
    for key in modulated:
        state["state_dict"][key] = 0.2 * torch.randn(state["state_dict"][key].shape, generator=generator)
    torch.save(state, run_dir / "modulated.pt")
    return run_dir / "modulated.pt"


@pytest.fixture(scope="module")
def ensemble_run(ensemble, dataset, tmp_path_factory) -> InferenceOutputs:
    """3 members, seed 7, with mean and spread, verified."""
    out = tmp_path_factory.mktemp("ensemble-forecast")
    overrides = ["members=3", "seed=7", "ensemble_stats=true", "verify=true", "verification.climatology_dates=4"]
    return forecast(ensemble, dataset, out / "forecast.nc", *overrides)


# ------------------------------------------------------------------------------------------------ the members
def test_members_have_a_number_dimension_and_are_reproducible_from_the_seed(ensemble_run, ensemble, dataset, tmp_path):
    with open_forecast(ensemble_run.forecast) as ds:
        assert ds.sizes["number"] == 3 and ds.attrs["ensemble_members"] == "3"
        np.testing.assert_array_equal(ds["number"].values, [0, 1, 2])
        for name in NAMES:
            assert ds[name].dims == ("time", "number", "step", "values") and ds[name].dtype == np.float32
    first = members_of(ensemble_run.forecast)
    again = members_of(forecast(ensemble, dataset, tmp_path / "again.nc", "members=3", "seed=7").forecast)
    other = members_of(forecast(ensemble, dataset, tmp_path / "other.nc", "members=3", "seed=8").forecast)
    for name in NAMES:
        np.testing.assert_array_equal(again[name], first[name], err_msg=name)
        assert not np.allclose(other[name], first[name], rtol=1e-3, atol=0), name
        spread = first[name].std(axis=1).mean() / first[name].std()
        assert spread > 1e-3, f"{name}: members barely differ ({spread:.2g} of the field's deviation)"


def test_a_member_depends_on_its_date_and_number_not_the_batch_or_the_other_dates(ensemble_run, ensemble, dataset,
                                                                                   tmp_path) -> None:  # fmt: skip
    config = infer_config(ensemble, f"dataset={dataset}", "dates=[2000-01-04T12]", "lead_time=18h", "members=3",
                          "seed=7", "batch_size=2", f"output={tmp_path / 'one.zarr'}")  # fmt: skip
    alone = members_of(run_inference(config).forecast)  # zarr: the same layout
    batched = members_of(ensemble_run.forecast)
    for name in NAMES:
        scale = np.abs(batched[name]).max()  # batch 2 against 1: other BLAS blocking
        np.testing.assert_allclose(alone[name][0], batched[name][1], rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_ensemble_mean_and_spread_are_numpys_over_the_members(ensemble_run) -> None:
    with open_forecast(ensemble_run.forecast) as ds:
        for name in NAMES:
            members = ds[name].values.astype(np.float64)  # (N, M, L, G)
            mean, spread = ds[f"{name}_mean"], ds[f"{name}_spread"]
            assert mean.dims == spread.dims == ("time", "step", "values")
            np.testing.assert_allclose(mean.values, members.mean(axis=1), rtol=1e-6, atol=1e-6, err_msg=name)
            np.testing.assert_allclose(spread.values, members.std(axis=1, ddof=1), rtol=1e-5, atol=1e-7)
            assert mean.attrs.get("units") == spread.attrs.get("units") == ds[name].attrs.get("units")


# ----------------------------------------------------------------------------------------------- verification
def fair_crps_and_mae(forecast_path: Path, dataset: Path, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Area-weighted fair CRPS of the members and MAE of their mean, (L, V), computed here with numpy."""
    group = zarr.open_group(dataset, mode="r")
    variables, dates = list(group.attrs["variables"]), group["dates"][:]
    members = members_of(forecast_path)
    size = members[NAMES[0]].shape[1]
    crps, mae = np.zeros((3, len(NAMES))), np.zeros((3, len(NAMES)))
    with open_forecast(forecast_path) as ds:
        valid = ds["valid_time"].values.astype("datetime64[s]")  # (N, L)
    for n, lead in np.ndindex(valid.shape):
        row = int(np.searchsorted(dates, valid[n, lead]))
        for v, name in enumerate(NAMES):
            x = members[name][n, :, lead].astype(np.float64)  # (M, G)
            y = group["data"][row, variables.index(name), 0]
            pairs = np.abs(x[:, None] - x[None]).sum(axis=(0, 1)) / (2 * size * (size - 1))
            crps[lead, v] += weight @ (np.abs(x - y).mean(axis=0) - pairs)
            mae[lead, v] += weight @ np.abs(x.mean(axis=0) - y)
    return crps / valid.shape[0], mae / valid.shape[0]


def test_verification_scores_the_mean_and_the_members(ensemble_run, ensemble, dataset) -> None:
    folder, result = ensemble_run.verification_output, ensemble_run.verification
    text = (folder / "verification.md").read_text()
    assert "An ensemble of 3 members" in text and "## Ensemble (3 members)" in text
    header = "| variable | lead | forecasts | CRPS | ensemble-mean RMSE | spread | spread / skill |"
    assert header in text.splitlines()
    for plot in ("rank_histogram.png", "spread_skill.png", "rmse_by_lead.png", "forecast_map.png"):
        assert (folder / plot).stat().st_size > 10_000, plot
    document = json.loads((folder / "verification.json").read_text())
    assert document["members"] == 3 and document["leads"] == ["6h", "12h", "18h"] and document["forecasts"] == [2] * 3
    weight = load_inference_checkpoint(ensemble).graph["data"].area_weight.double().numpy()
    crps, mae = fair_crps_and_mae(ensemble_run.forecast, dataset, weight / weight.sum())
    ensemble_scores = result.ensemble
    np.testing.assert_allclose(ensemble_scores.crps, crps, rtol=1e-6)
    np.testing.assert_allclose(result.mae["model"], mae, rtol=1e-6)
    np.testing.assert_allclose(ensemble_scores.ensemble_mean_rmse, result.rmse["model"], rtol=1e-9)
    np.testing.assert_allclose(ensemble_scores.spread_skill, ensemble_scores.spread / result.rmse["model"], rtol=1e-9)
    np.testing.assert_allclose(ensemble_scores.rank_histogram.sum(-1), 1.0)
    keys = {"rmse", "mae", "bias", "persistence_rmse", "persistence_mae", "climatology_rmse", "climatology_mae",
            "crps", "ens_rmse", "spread", "ssr"}  # fmt: skip
    for v, name in enumerate(NAMES):
        for li, lead in enumerate(document["leads"]):
            cell = document["scores"][name][lead]
            assert set(cell) == keys, cell
            assert cell["crps"] == pytest.approx(crps[li, v], rel=1e-6) and cell["mae"] == pytest.approx(mae[li, v])
            assert cell["ssr"] == pytest.approx(ensemble_scores.spread_skill[li, v])


# --------------------------------------------------------------------------------- one member, bad settings
def test_one_member_keeps_the_single_forecast_layout(deterministic, ensemble, dataset, tmp_path) -> None:
    for name, checkpoint in (("deterministic", deterministic), ("noise", ensemble)):
        outputs = forecast(
            checkpoint,
            dataset,
            tmp_path / f"{name}.zarr",
            "verify=true",
            "verification.climatology_dates=0",
            f"verification.output={tmp_path / name}",
        )
        with open_forecast(outputs.forecast) as ds:
            assert dict(ds.sizes) == {"time": 2, "step": 3, "values": 128} and "number" not in ds.coords
            assert sorted(ds.data_vars) == NAMES and "ensemble_members" not in ds.attrs
        document = json.loads((tmp_path / name / "verification.json").read_text())
        assert document["members"] == 1 and outputs.verification.ensemble is None
        assert set(document["scores"]["sp"]["6h"]) == {"rmse", "mae", "bias", "persistence_rmse", "persistence_mae"}
        assert "## Ensemble" not in (tmp_path / name / "verification.md").read_text()
        assert not (tmp_path / name / "rank_histogram.png").exists()


def test_members_on_a_deterministic_checkpoint_stop_with_one_message(deterministic, dataset, tmp_path) -> None:
    config = infer_config(deterministic, f"dataset={dataset}", DATES, "members=2", f"output={tmp_path}/f.nc")
    message = setup_error(config)
    assert message == (
        f"members=2 needs a model with processor noise (trained with model.noise and training.ensemble.members > 1), "
        f"but checkpoint {deterministic} holds a deterministic model; set members=1 or use an ensemble checkpoint"
    )
    documented(message, FILE=deterministic)
    args = [f"checkpoint={deterministic}", f"dataset={dataset}", DATES, "members=2", f"output={tmp_path}/f.nc"]
    result = run_infer_cli(args, tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output and message in output, output
    assert not (tmp_path / "f.nc").exists()


def test_ensemble_stats_without_members_is_a_config_error(deterministic) -> None:
    message = config_error(deterministic, DATES, "output=f.nc", "ensemble_stats=true")
    assert message == "ensemble_stats=true needs members of 2 or more (got members=1)"
    documented(message)


# ------------------------------------------------------------------------------------------------ two shards
def test_the_members_of_two_shards_equal_one_process(ensemble_run, ensemble, dataset, tmp_path) -> None:
    """Both ranks of a sharded model copy draw the same noise: the file equals the one process's."""
    port, processes = free_port(), []
    for rank in range(2):
        variables = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
        variables.update(OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))  # fmt: skip
        command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={ensemble}", f"dataset={dataset}",
                   DATES, "lead_time=18h", "members=3", "seed=7", "device=cpu", "num_gpus_per_model=2",
                   f"output={tmp_path / 'sharded.nc'}", f"hydra.run.dir={tmp_path / f'hydra-{rank}'}"]  # fmt: skip
        processes.append(subprocess.Popen(command, env=variables, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))  # fmt: skip
    for code, output in wait_all(processes, 240):
        assert code == 0 and "Traceback" not in output, output[-3000:]
    sharded, single = members_of(tmp_path / "sharded.nc"), members_of(ensemble_run.forecast)
    for name in NAMES:
        scale = np.abs(single[name]).max()
        np.testing.assert_allclose(sharded[name], single[name], rtol=1e-5, atol=1e-5 * scale, err_msg=name)

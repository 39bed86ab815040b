"""Validation for forecast skill: the climatology baseline, scoring on another trajectory, and the skill benchmark."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from torch import nn

from anemo_like.data.builtin import ensure_builtin_dataset
from anemo_like.data.climatology import mean_state
from anemo_like.data.setup import LoaderOptions, setup_data
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.models.rollout import ForecastSpec
from anemo_like.training.loss import WeightedMSE
from anemo_like.training.trainer import Trainer
from anemo_like.training.validation import Scoring, validate

SKILL_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "skill" / "skill.py"


@pytest.fixture(scope="module")
def builtin_path(cache_dir) -> Path:
    return ensure_builtin_dataset(cache_dir)


def test_climatology_is_each_points_mean_over_evenly_spaced_dates(builtin_path) -> None:
    store = open_anemoi_zarr(builtin_path)
    variables = store.variable_indices(["z_500", "t_850"])
    everything = store.read(slice(10, 110), variables).astype(np.float64)  # (T, V, G)
    full = mean_state(store, date_start=10, date_stop=110, variables=variables, max_dates=1000)
    np.testing.assert_allclose(full, everything.mean(0).T, rtol=1e-12)
    every_11th = mean_state(store, date_start=10, date_stop=110, variables=variables, max_dates=10)
    np.testing.assert_allclose(every_11th, everything[::11].mean(0).T, rtol=1e-12)


class _ConstantForecast(nn.Module):
    """Predicts the same normalised field (G, V_out) for every input."""

    def __init__(self, field: np.ndarray) -> None:
        super().__init__()
        self.register_buffer("field", torch.as_tensor(field))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.field.expand(x.shape[0], *self.field.shape)


def test_climatology_is_scored_like_a_forecast_and_in_physical_units(tmp_path, compose_run) -> None:
    config = compose_run(tmp_path, ["training.val_rollout=3", "training.val_climatology_dates=50"])
    data = setup_data(config)
    assert data.climatology.shape == (2048, len(data.roles.output))
    weight = torch.rand(2048) + 0.5
    scale = data.normalizer.scale[[data.roles.read.index(n) for n in data.roles.output]]
    spec = ForecastSpec(
        multistep=2,
        input_positions=data.input_positions,
        output_positions=data.output_positions,
        num_prognostic=len(data.roles.prognostic),
    )
    scoring = Scoring(
        output_names=data.roles.output,
        output_scale=scale,
        area_weight=weight,
        step_length=data.store.frequency,
        loss_fn=WeightedMSE(area_weight=weight, variable_weight=torch.ones(len(data.roles.output))),
        climatology=data.climatology,
    )
    kwargs = dict(spec=spec, scoring=scoring, steps=3, device=torch.device("cpu"), limit_batches=2)
    loader = data.val_loader(LoaderOptions(batch_size=8))
    result = validate(_ConstantForecast(data.climatology), loader, **kwargs)
    np.testing.assert_allclose(result.model_rmse, result.climatology_rmse, rtol=1e-6)
    # by hand: area-weighted RMSE of (climatology - truth) in physical units over the same 16 samples, 3 leads
    truth = torch.stack([data.val[i] for i in range(16)])[:, 2:].index_select(-1, torch.tensor(data.output_positions))
    error = (torch.as_tensor(data.climatology)[None, None] - truth).double().numpy() * scale
    w = (weight / weight.sum()).double().numpy()
    expected = np.sqrt(np.einsum("g,btgv->tv", w, error**2) / 16)
    np.testing.assert_allclose(result.climatology_rmse, expected, rtol=1e-5)
    assert result.lead_hours == [6.0, 12.0, 18.0] and result.num_samples == 16
    assert "climatology RMSE" in result.table().splitlines()[0]
    without_climatology = dataclasses.replace(scoring, climatology=None)
    without = validate(_ConstantForecast(data.climatology), loader, **(kwargs | {"scoring": without_climatology}))
    assert without.climatology_rmse is None and without.table().splitlines()[2].endswith("| n/a |")


def _copy_dataset(source: Path, target: Path, edit) -> Path:
    shutil.copytree(source, target)
    edit(zarr.open_group(target, mode="r+"))
    return target


def test_validation_reads_another_trajectory_of_the_same_grid(tmp_path, builtin_path, compose_run) -> None:
    def shift_in_time(group) -> None:  # another "trajectory": the states of 40 days later, same dates and grid
        data = group["data"]
        data[:] = np.roll(data[:], -160, axis=0)

    other = _copy_dataset(builtin_path, tmp_path / "other.zarr", shift_in_time)
    same = setup_data(compose_run(tmp_path / "a", []))
    moved = setup_data(compose_run(tmp_path / "b", [f"data.val_dataset={other}"]))
    assert moved.val.store.path == other and moved.train.store.path == same.train.store.path
    first_date = same.val.date_start
    expected = same.train.store.read(slice(first_date + 160, first_date + 161), same.val.read_index)[0]
    np.testing.assert_allclose(
        moved.val[0][0, :, : len(same.roles.read)].numpy(), same.normalizer.normalize(expected.T), rtol=1e-6
    )
    np.testing.assert_array_equal(moved.normalizer.scale, same.normalizer.scale)  # training statistics
    np.testing.assert_array_equal(moved.climatology, same.climatology)  # training dates


def test_a_trained_checkpoint_is_scored_on_another_trajectory_without_training(
    tmp_path, builtin_path, compose_run
) -> None:
    other = _copy_dataset(builtin_path, tmp_path / "other.zarr", lambda group: None)
    group = zarr.open_group(other, mode="r+")
    group["data"][:] = np.roll(group["data"][:], -160, axis=0)
    trained = Trainer(compose_run(tmp_path / "train", ["training.max_steps=2", "diagnostics.plots=false"])).fit()
    checkpoint = trained.training_checkpoint
    scored = Trainer(
        compose_run(
            tmp_path / "score",
            [f"training.resume={checkpoint}", "training.max_steps=2", f"data.val_dataset={other}"],
        )
    ).fit()
    assert scored.validation.num_samples == trained.validation.num_samples
    assert not np.allclose(scored.validation.model_rmse, trained.validation.model_rmse)
    assert (tmp_path / "score" / "validation.md").exists() and (tmp_path / "score" / "rmse_by_lead.png").exists()
    records = [json.loads(line) for line in (tmp_path / "score" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2] and "val_loss" in records[0]  # scored, not trained


def test_validation_dataset_of_another_grid_is_refused_naming_both(tmp_path, builtin_path, compose_run) -> None:
    def move_grid(group) -> None:
        group["latitudes"][:] = group["latitudes"][:] * 0.5

    other = _copy_dataset(builtin_path, tmp_path / "shifted.zarr", move_grid)
    with pytest.raises(ValueError) as error:
        setup_data(compose_run(tmp_path, [f"data.val_dataset={other}"]))
    message = str(error.value)
    assert f"data.val_dataset {other}: its grid (2048 points) differs from data.dataset {builtin_path}" in message
    assert "validate on a dataset of the same grid" in message


def test_training_writes_rmse_by_lead_plot_and_climatology_column(tmp_path, compose_run) -> None:
    config = compose_run(tmp_path, ["training.max_steps=2", "training.val_rollout=2"])
    outputs = Trainer(config).fit()
    assert (tmp_path / "rmse_by_lead.png").stat().st_size > 10_000
    table = (tmp_path / "validation.md").read_text().splitlines()
    assert table[0].endswith("| climatology RMSE |") and len(table) == 2 + 2 * len(outputs.validation.variables)
    assert outputs.validation.climatology_rmse.shape == (2, len(outputs.validation.variables))
    # the climatology does not depend on the lead much and is far worse than a 6 h persistence forecast
    assert np.all(outputs.validation.climatology_rmse[0] > outputs.validation.persistence_rmse[0])


def test_skill_benchmark_prints_one_json_line_with_both_runs_of_the_two_stage_recipe(tmp_path, builtin_path) -> None:
    tiny = [
        "graph.mesh_resolution=1",
        "model.num_channels=16",
        "model.processor.num_layers=1",
        "model.processor.num_chunks=1",
        "dataloader.limit_batches.val=1",
        "diagnostics.plots=false",
    ]
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"config": "hs_t21_cpu", "pretrain": None, "runs": [{"cpu_s": 1e6}]}))
    command = [
        sys.executable,
        str(SKILL_SCRIPT),
        f"--dataset={builtin_path}",
        "--config=quickstart",
        "--pretrain=quickstart",
        *[f"--pretrain-set={override}" for override in [*tiny, "training.max_steps=3"]],
        f"--baseline={baseline}",
        "--runs=2",
        f"--output={tmp_path}",
        "--",
        *tiny,
        "training.max_steps=2",
        "training.val_rollout=4",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert [run["steps"] for run in result["runs"]] == [2, 2]  # the second stage's
    assert all(run["wall_s"] > 0 and run["cpu_s"] > 0 for run in result["runs"])
    for run in ("run0", "run1"):  # each run built its own graph, then fine-tuned from its own first stage
        assert (tmp_path / run / "cache" / "graphs").is_dir()
        log = (tmp_path / run / "finetune" / "stdout.log").read_text()
        assert f"training.init_from: weights of {tmp_path / run / 'pretrain' / 'inference.pt'}" in log
    assert set(result["runs"][0]["rmse"]) == {"z_500_6h", "z_500_1d", "t_850_6h", "t_850_1d", "u_250_6h"} | {
        "u_250_1d",
        "sp_6h",
        "sp_1d",
    }
    assert result["max_relative_spread"] < 0.02  # same config and seed
    assert result["hs_t21_cpu_cpu_s"] == 1e6 and result["meets_cpu_limit"] is True  # the limit scales with it
    assert result["meets_skill_target"] is False  # 5 steps, and the built-in data has no v_500
    assert result["meets_time_to_skill"] is False


def test_skill_benchmark_refuses_a_baseline_of_another_config(tmp_path, builtin_path) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"config": "quickstart", "pretrain": None, "runs": [{"cpu_s": 10}]}))
    command = [sys.executable, str(SKILL_SCRIPT), f"--dataset={builtin_path}", f"--baseline={baseline}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and f"--baseline {baseline}: expected" in done.stderr
    assert "Traceback" not in done.stderr and not list(tmp_path.glob("run*"))

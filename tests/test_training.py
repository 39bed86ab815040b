"""End-to-end training on the built-in dataset: the loss falls, resume is exact, checkpoints load safely."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import SHARED_DATASET, TINY_MODEL
from resume_helpers import Killed, die_after_checkpoint

from anemo_like.data.builtin import ensure_builtin_dataset
from anemo_like.data.window_dataset import NonFiniteDataError
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.inference import load_inference_checkpoint
from anemo_like.training.trainer import Trainer


def losses(metrics: Path) -> dict[int, float]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def test_short_training_lowers_loss_and_writes_outputs(tmp_path, compose_run) -> None:
    config = compose_run(
        tmp_path, ["training.max_steps=40", "training.val_every_n_steps=40", "training.optimizer.warmup_steps=5"]
    )
    outputs = Trainer(config).fit()
    curve = losses(outputs.metrics)
    assert len(curve) == 40
    first, last = sum(list(curve.values())[:5]) / 5, sum(list(curve.values())[-5:]) / 5
    assert last < 0.7 * first, f"loss did not fall: first 5 mean {first:.4f}, last 5 mean {last:.4f}"
    for name in ("inference.pt", "checkpoints/last.pt", "validation.md", "loss_curve.png", "forecast_map.png"):
        assert (tmp_path / name).is_file(), name
    assert "persistence RMSE" in (tmp_path / "validation.md").read_text()


def test_inference_checkpoint_loads_weights_only_and_reproduces(tmp_path, compose_run, caplog) -> None:
    auto = ["model.encoder.num_chunks=auto", "model.processor.num_chunks=auto", "system.hardware.memory_budget_gb=2"]
    auto += ["model.encoder.gradient_checkpointing=auto"]
    config = compose_run(tmp_path, ["training.max_steps=3", "diagnostics.plots=false", *auto])
    trainer = Trainer(config)
    assert trainer.config.model.encoder.num_chunks == 1 and trainer.config.model.processor.num_chunks == 1
    assert trainer.config.model.encoder.gradient_checkpointing is False, "2 GB: no recomputation needed"
    with caplog.at_level(logging.INFO, logger="anemo_like.training.plan_check"):
        outputs = trainer.fit()
    assert "memory plan check: predicted peak step memory" in caplog.text
    raw = torch.load(outputs.inference_checkpoint, weights_only=True)
    assert {"state_dict", "graph", "config", "roles", "normalizer"} <= raw.keys()
    bundle = load_inference_checkpoint(outputs.inference_checkpoint)
    assert bundle.config.model.encoder.num_chunks == 1, "the checkpoint keeps the resolved chunk counts"
    assert bundle.roles.prognostic == list(config.data.variables.prognostic)
    x = torch.randn(1, 2, bundle.graph["data"].num_nodes, bundle.model.layout.num_input)
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(bundle.model(x), trainer.model(x))


def test_interrupted_and_resumed_training_matches_uninterrupted(tmp_path, compose_run, monkeypatch) -> None:
    common = ["training.max_steps=6", "training.checkpoint_every_n_steps=3", "training.val_every_n_steps=6"]
    full = Trainer(compose_run(tmp_path / "full", common)).fit()

    die_after_checkpoint(monkeypatch, 3)
    with pytest.raises(Killed):
        Trainer(compose_run(tmp_path / "killed", common)).fit()
    monkeypatch.undo()
    checkpoint = tmp_path / "killed" / "checkpoints" / "last.pt"
    resumed = Trainer(compose_run(tmp_path / "killed", [*common, f"training.resume={checkpoint}"])).fit()

    expected, got = losses(full.metrics), losses(resumed.metrics)
    assert sorted(got) == list(range(1, 7))
    for step in range(1, 7):
        assert got[step] == expected[step], f"step {step}: resumed {got[step]} != uninterrupted {expected[step]}"
    for name, tensor in torch.load(full.training_checkpoint, weights_only=True)["model"].items():
        torch.testing.assert_close(torch.load(resumed.training_checkpoint, weights_only=True)["model"][name], tensor)


def test_resume_refuses_a_checkpoint_of_another_model_and_survives_a_cut_metrics_line(tmp_path, compose_run) -> None:
    common = ["training.max_steps=2", "diagnostics.plots=false"]
    first = Trainer(compose_run(tmp_path, common)).fit()
    with first.metrics.open("a") as f:
        f.write('{"step": 3, "train_lo')  # a write cut short by a kill
    wider = compose_run(tmp_path, [*common, "model.num_channels=32", f"training.resume={first.training_checkpoint}"])
    with pytest.raises(ValueError, match=r"model.num_channels: 16 -> 32"):
        Trainer(wider)
    resumed = Trainer(
        compose_run(
            tmp_path,
            [
                "training.max_steps=3",
                "diagnostics.plots=false",
                "model.decoder.num_chunks=8",  # chunking does not change the weights: resuming with more is fine
                f"training.resume={first.training_checkpoint}",
            ],
        )
    ).fit()
    assert sorted(losses(resumed.metrics)) == [1, 2, 3]


def test_anemo_train_cli_runs_from_any_directory_with_a_user_config_dir(tmp_path, cache_dir) -> None:
    user_configs = tmp_path / "my_configs"
    user_configs.mkdir()
    (user_configs / "mine.yaml").write_text("defaults:\n  - quickstart\n  - _self_\ntraining:\n  max_steps: 2\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "ANEMO_LIKE_CACHE": str(cache_dir)}
    command = [
        str(Path(sys.executable).with_name("anemo-train")),
        f"--config-dir={user_configs}",
        "--config-name=mine",
        *TINY_MODEL,
        "diagnostics.plots=false",
        f"hydra.run.dir={run_dir}",
    ]
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "trained to step 2" in done.stdout + done.stderr
    assert "persistence RMSE" in done.stdout + done.stderr
    assert (run_dir / "inference.pt").is_file()


def test_cli_reports_a_dataset_mismatch_in_one_line_and_exits_2(tmp_path, cache_dir) -> None:
    command = [
        str(Path(sys.executable).with_name("anemo-train")),
        "--config-name=quickstart",
        "data.variables.prognostic=[z_500,t_860]",
        f"system.paths.cache={cache_dir}",
        f"hydra.run.dir={tmp_path}",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "unknown variable(s) 't_860' (did you mean 't_850'?)" in output
    assert "Traceback" not in output


@pytest.mark.skipif(not SHARED_DATASET.exists(), reason=f"real anemoi dataset not present at {SHARED_DATASET}")
def test_hs_t21_config_trains_on_the_real_anemoi_dataset(tmp_path, compose_run) -> None:
    config = compose_run(
        tmp_path,
        [
            f"data.dataset={SHARED_DATASET}",
            "training.max_steps=3",
            "diagnostics.plots=false",
            "dataloader.limit_batches.val=4",
        ],
        name="hs_t21",
    )
    result = Trainer(config).fit().validation
    assert result.variables == list(config.data.variables.prognostic) and len(result.variables) == 11
    # 6 h persistence in physical units, as in ../shared/data/README.md (which scores every date of the year)
    persistence = dict(zip(result.variables, result.persistence_rmse[0], strict=True))
    assert persistence["z_500"] == pytest.approx(130.0, rel=0.2)
    assert persistence["t_850"] == pytest.approx(0.677, rel=0.2)


def test_learning_rate_scales_with_the_number_of_model_instances() -> None:
    from anemo_like.training.schedule import learning_rate_scale

    assert [learning_rate_scale(rule, 4) for rule in ("none", "linear", "sqrt")] == [1.0, 4.0, 2.0]
    assert learning_rate_scale("linear", 1) == learning_rate_scale("sqrt", 1) == 1.0


# ------------------------------------------------------------------------------------------ resume and validation
def records_by_kind(metrics: Path) -> dict[str, list[int]]:
    """Steps of the training-loss and validation records, in file order."""
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {kind: [r["step"] for r in records if kind in r] for kind in ("train_loss", "val_loss")}


def test_repeated_resumes_record_each_step_once(tmp_path, compose_run) -> None:
    common = ["diagnostics.plots=false", "training.val_every_n_steps=2", "training.resume=auto"]
    for max_steps, times in ((2, 3), (4, 2)):  # a finished run resumed three times, then extended and resumed again
        for _ in range(times):
            outputs = Trainer(compose_run(tmp_path, [*common, f"training.max_steps={max_steps}"])).fit()
            steps = records_by_kind(outputs.metrics)
            assert steps == {"train_loss": list(range(1, max_steps + 1)), "val_loss": list(range(2, max_steps + 1, 2))}


def nan_in_validation_dataset(path: Path, builtin: Path) -> Path:
    """The built-in dataset with one NaN at one point of a validation date (2000-11-02T00)."""
    group = zarr.open_group(builtin, mode="r")
    dates = group["dates"][:]
    data = group["data"][:]
    data[int(np.searchsorted(dates, np.datetime64("2000-11-02T00", "s"))), 0, 0, 7] = np.nan
    return write_anemoi_zarr(
        path,
        data=data,
        variables=list(group.attrs["variables"]),
        dates=dates,
        latitudes=group["latitudes"][:],
        longitudes=group["longitudes"][:],
        frequency=group.attrs["frequency"],
    )


@pytest.mark.parametrize(
    ("schedule", "saved_step"),
    [
        (["training.max_steps=4", "training.checkpoint_every_n_steps=2", "training.val_every_n_steps=2"], 2),
        (["training.max_steps=3", "training.checkpoint_every_n_steps=100", "training.val_every_n_steps=100"], 3),
        (["training.max_steps=6", "training.checkpoint_every_n_steps=3", "training.val_every_n_steps=3"], 3),
    ],
    ids=["checkpoint-and-validation-steps-coincide", "last-step", "every-3"],
)
def test_a_failing_validation_keeps_the_checkpoint_of_its_step(tmp_path, compose_run, cache_dir, schedule, saved_step):
    dataset = nan_in_validation_dataset(tmp_path / "nan.zarr", ensure_builtin_dataset(cache_dir))
    config = compose_run(tmp_path / "run", [f"data.dataset={dataset}", "diagnostics.plots=false", *schedule])
    with pytest.raises(NonFiniteDataError):
        Trainer(config).fit()
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert checkpoint["step"] == saved_step


def test_a_model_with_floored_outputs_writes_an_inference_checkpoint_that_loads(tmp_path, compose_run) -> None:
    """The output floors (-inf where none) derive from the stored layout: they are not saved as weights, which a
    loader would refuse as non-finite."""
    config = compose_run(tmp_path, ["training.max_steps=2", "diagnostics.plots=false", "model.relu_bounded=[sp]"])
    outputs = Trainer(config).fit()
    bundle = load_inference_checkpoint(outputs.inference_checkpoint)
    floor = bundle.model.output_floor
    assert floor is not None and torch.isinf(floor).sum() == len(bundle.roles.output) - 1


def test_a_timed_checkpoint_falls_due_after_its_minutes_from_the_last_one(tmp_path, compose_run) -> None:
    timed = Trainer(compose_run(tmp_path / "timed", ["training.checkpoint_every_minutes=1.5"])).checkpoints
    timed.restart_clock()
    start = timed.saved_at
    assert not timed.due_by_time(start + 89.0) and timed.due_by_time(start + 91.0)
    timed.save(step=0)  # a checkpoint restarts the count
    assert timed.saved_at >= start and not timed.due_by_time(timed.saved_at + 89.0)
    untimed = Trainer(compose_run(tmp_path / "untimed", [])).checkpoints
    assert not untimed.due_by_time(untimed.saved_at + 1e6)

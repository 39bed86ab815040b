"""Kill and preemption: a run killed at any step resumes to the same losses, a kill during a checkpoint write
leaves the previous checkpoint loadable, SIGTERM/SIGUSR1 write a checkpoint and exit 0, and a second signal while
the command stops keeps that status. Real processes, real signals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL

RUN = [
    *TINY_MODEL,
    "system.hardware.num_threads=1",
    "training.val_every_n_steps=1000",
    "diagnostics.plots=false",
]


def start(
    run_dir: Path,
    cache_dir: Path,
    overrides: list[str],
    save_pause_s: float | None = None,
    *,
    launcher: list[str] | None = None,
):
    """anemo-train in a subprocess; with ``save_pause_s``, every checkpoint write pauses halfway that long;
    ``launcher``: another script and its arguments before the overrides."""
    if launcher is None and save_pause_s is None:
        launcher = ["-m", "anemo_like.cli.train"]
    elif launcher is None:
        launcher = [str(Path(__file__).with_name("slow_checkpoint_writes.py")), str(save_pause_s)]
    command = [
        sys.executable,
        *launcher,
        *RUN,
        *overrides,
        f"system.paths.output={run_dir}",
        f"system.paths.cache={cache_dir}",
        f"hydra.run.dir={run_dir / 'hydra'}",
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def logged_losses(run_dir: Path) -> dict[int, float]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def finish(process: subprocess.Popen, timeout: float = 180.0) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output


def test_sigkill_at_a_random_step_then_resume_auto_gives_the_uninterrupted_losses(tmp_path, cache_dir):
    common = ["training.max_steps=12", "training.checkpoint_every_n_steps=1"]
    code, output = finish(start(tmp_path / "full", cache_dir, common))
    assert code == 0, output[-2000:]
    expected = logged_losses(tmp_path / "full")

    kill_after = random.Random().randint(2, 8)
    killed = start(tmp_path / "killed", cache_dir, common)
    wait_for(lambda: max(logged_losses(tmp_path / "killed"), default=0) >= kill_after)
    killed.send_signal(signal.SIGKILL)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL
    code, output = finish(start(tmp_path / "killed", cache_dir, [*common, "training.resume=auto"]))
    assert code == 0, output[-2000:]
    assert "resumed from" in output
    assert logged_losses(tmp_path / "killed") == expected, f"killed after step {kill_after}"


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_checkpoint(tmp_path, cache_dir):
    code, output = finish(start(tmp_path, cache_dir, ["training.max_steps=2", "training.checkpoint_every_n_steps=2"]))
    assert code == 0, output[-2000:]
    latest = tmp_path / "checkpoints" / "last.pt"
    assert torch.load(latest, weights_only=True)["step"] == 2

    slow = start(
        tmp_path,
        cache_dir,
        ["training.max_steps=4", "training.checkpoint_every_n_steps=2", "training.resume=auto"],
        save_pause_s=60,
    )
    folder = tmp_path / "checkpoints"
    wait_for(lambda: any(p.stat().st_size > 0 for p in folder.glob(".step-000000004.pt.*.tmp")))
    slow.send_signal(signal.SIGKILL)
    slow.communicate(timeout=60)
    state = torch.load(latest, weights_only=True)
    assert state["step"] == 2 and state["format"] == "anemo_like-training-v1"
    assert sorted(p.name for p in folder.glob("step-*.pt")) == ["step-000000002.pt"]
    code, output = finish(start(tmp_path, cache_dir, ["training.max_steps=4", "training.resume=auto"]))
    assert code == 0 and "resumed from" in output and "at step 2" in output, output[-2000:]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGUSR1])
def test_preemption_signal_writes_a_checkpoint_and_exits_zero(tmp_path, cache_dir, signum):
    running = start(tmp_path, cache_dir, ["training.max_steps=100000", "training.checkpoint_every_n_steps=1000"])
    wait_for(lambda: max(logged_losses(tmp_path), default=0) >= 3)
    running.send_signal(signum)
    code, output = finish(running, timeout=60)
    assert code == 0, output[-2000:]
    assert f"received {signal.Signals(signum).name}" in output and "exiting with status 0" in output
    stopped_at = max(logged_losses(tmp_path))
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["step"] == stopped_at
    assert "Traceback" not in output


LONG_RUN = ["training.max_steps=100000", "training.checkpoint_every_n_steps=1000"]


def assert_stopped_with_status_zero(code: int, output: str, first: signal.Signals, run_dir: Path) -> None:
    """Exit status 0, and the last line says so: the first signal's stop line, no other signal reported."""
    stopped_at = max(logged_losses(run_dir))
    checkpoint = run_dir / "checkpoints" / "last.pt"
    assert code == 0, output[-3000:]
    assert (
        output.strip()
        .splitlines()[-1]
        .endswith(
            f"received {first.name}: stopped after step {stopped_at}, checkpoint {checkpoint} written; exiting with "
            "status 0 (training.resume=auto continues from it)"
        )
    ), output[-3000:]
    assert output.count("received ") == 1 and "Traceback" not in output, output[-3000:]
    assert torch.load(checkpoint, weights_only=True)["step"] == stopped_at


SECOND_SIGNALS = [
    (signal.SIGTERM, signal.SIGTERM),
    (signal.SIGTERM, signal.SIGINT),
    (signal.SIGINT, signal.SIGTERM),
]


@pytest.mark.parametrize(("first", "second"), SECOND_SIGNALS, ids=lambda s: s.name)
def test_a_second_signal_after_the_stop_line_keeps_its_status(tmp_path, cache_dir, first, second):
    """The second signal arrives after the last line, while the process closes its log and exits."""
    closing = tmp_path / "closing-the-log"
    launcher = [str(Path(__file__).with_name("slow_log_close.py")), "5", str(closing)]
    running = start(tmp_path / "run", cache_dir, LONG_RUN, launcher=launcher)
    wait_for(lambda: max(logged_losses(tmp_path / "run"), default=0) >= 3)
    running.send_signal(first)
    wait_for(closing.exists, timeout=60)
    running.send_signal(second)
    code, output = finish(running, timeout=60)
    assert_stopped_with_status_zero(code, output, first, tmp_path / "run")


@pytest.mark.parametrize(("first", "second"), SECOND_SIGNALS[1:], ids=lambda s: s.name)
def test_a_second_signal_during_the_stop_checkpoint_write_keeps_its_status(tmp_path, cache_dir, first, second):
    running = start(tmp_path, cache_dir, LONG_RUN, save_pause_s=3)
    wait_for(lambda: max(logged_losses(tmp_path), default=0) >= 3)
    running.send_signal(first)
    folder = tmp_path / "checkpoints"
    wait_for(lambda: folder.is_dir() and any(p.stat().st_size > 0 for p in folder.glob(".step-*.pt.*.tmp")))
    running.send_signal(second)
    code, output = finish(running, timeout=60)
    assert_stopped_with_status_zero(code, output, first, tmp_path)


def test_checkpoints_keep_the_last_n_and_carry_version_metadata(tmp_path, compose_run):
    from anemo_like.training.trainer import Trainer

    overrides = ["training.max_steps=5", "training.checkpoint_every_n_steps=1", "training.checkpoint_keep_last=2"]
    trainer = Trainer(compose_run(tmp_path, [*overrides, "diagnostics.plots=false"]))
    trainer.fit()
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.glob("step-*.pt")) == ["step-000000004.pt", "step-000000005.pt"]
    state = torch.load(folder / "last.pt", weights_only=True)
    assert state["step"] == 5 and state["graph_hash"] == trainer.graph_hash and len(state["config_hash"]) == 16
    assert os.path.samefile(folder / "last.pt", folder / "step-000000005.pt")


def test_resume_refuses_a_checkpoint_trained_on_another_graph(tmp_path, compose_run):
    from anemo_like.training.trainer import Trainer

    first = Trainer(compose_run(tmp_path, ["training.max_steps=1", "diagnostics.plots=false"])).fit()
    state = torch.load(first.training_checkpoint, weights_only=True)
    state["graph_hash"] = "0123456789abcdef"
    torch.save(state, tmp_path / "other-graph.pt")
    with pytest.raises(ValueError, match=r"was trained on another graph \(hash 0123456789abcdef"):
        Trainer(compose_run(tmp_path, [f"training.resume={tmp_path / 'other-graph.pt'}"]))

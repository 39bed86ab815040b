"""Reliability (docs/errors.md, "Runs, signals and disks"): a run owns its folder, a diverging run stops loudly,
stop signals are handled in every phase, an uncreatable folder is one message (a full disk: test_full_disk.py).
Real processes, real signals."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from bad_input_helpers import message_of
from conftest import TINY_MODEL

from anemo_like.atomic_io import atomic_torch_save
from anemo_like.checkpoints.inference import load_inference_checkpoint
from anemo_like.checkpoints.training import load_training_checkpoint
from anemo_like.interrupts import Interrupted, handling_signals
from anemo_like.training.nonfinite import NonFiniteSteps
from anemo_like.training.trainer import Trainer

RUN = [*TINY_MODEL, "system.hardware.num_threads=1", "training.val_every_n_steps=1000", "diagnostics.plots=false"]
DIVERGING = ["training.optimizer.lr=1e20", "training.optimizer.warmup_steps=0", "training.checkpoint_every_n_steps=1"]


def start(run_dir: Path, cache_dir: Path, *overrides: str, cwd: Path | None = None) -> subprocess.Popen:
    """anemo-train in a subprocess writing into ``run_dir``; stdout and stderr merged."""
    command = [
        sys.executable,
        "-m",
        "anemo_like.cli.train",
        *RUN,
        f"system.paths.output={run_dir}",
        f"system.paths.cache={cache_dir}",
        f"hydra.run.dir={run_dir.parent / (run_dir.name + '-hydra')}",
        *overrides,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    assert "Traceback" not in output, output[-3000:]
    return process.returncode, output


def error_line(output: str) -> str:
    """The one message a failed command printed (the logged error, without its time stamp and logger)."""
    lines = [line for line in output.splitlines() if "[ERROR] - " in line or line.startswith("anemo-")]
    assert lines, output[-3000:]
    return lines[-1].split("[ERROR] - ", 1)[-1]


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ------------------------------------------------------------------------------------- a run owns its folder
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, cache_dir) -> Path:
    """A finished 2-step run (checkpoints, metrics, inference.pt)."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    code, output = finish(start(run_dir, cache_dir, "training.max_steps=2", "training.checkpoint_every_n_steps=1"))
    assert code == 0, output[-3000:]
    return run_dir


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_run_refuses_a_folder_holding_another_run(tmp_path, cache_dir, finished_run) -> None:
    copies = {name: tmp_path / name for name in ("whole", "metrics-only", "inference-only", "resume-elsewhere")}
    for copy in copies.values():
        shutil.copytree(finished_run, copy)
    shutil.rmtree(copies["metrics-only"] / "checkpoints")
    (copies["metrics-only"] / "inference.pt").unlink()
    (copies["inference-only"] / "metrics.jsonl").unlink()
    shutil.rmtree(copies["inference-only"] / "checkpoints")
    before = {name: snapshot(folder) for name, folder in copies.items()}
    other = tmp_path / "other-run.pt"
    shutil.copy(finished_run / "checkpoints" / "last.pt", other)
    started = {
        name: start(
            folder, cache_dir, "training.max_steps=4", *([f"training.resume={other}"] if "elsewhere" in name else [])
        )
        for name, folder in copies.items()
    }
    held = {
        "whole": "checkpoints/last.pt, checkpoints/step-000000001.pt, checkpoints/step-000000002.pt, inference.pt "
        "and 1 more",
        "metrics-only": "metrics.jsonl",
        "inference-only": "inference.pt",
        "resume-elsewhere": "checkpoints/last.pt, checkpoints/step-000000001.pt, checkpoints/step-000000002.pt, "
        "inference.pt and 1 more",
    }
    for name, process in started.items():
        code, output = finish(process)
        assert code == 2, output[-3000:]
        assert error_line(output) == (
            f"system.paths.output {copies[name]} already holds a run ({held[name]}): set training.resume=auto to "
            "continue it, or choose another folder (system.paths.output=...)"
        )
        assert snapshot(copies[name]) == before[name], f"{name}: the other run's files changed"


def test_resume_auto_continues_the_folders_run_and_pruning_keeps_other_runs_checkpoints(tmp_path, compose_run):
    run = compose_run(tmp_path, ["training.max_steps=2", "training.checkpoint_every_n_steps=1"])
    Trainer(run).fit()
    folder = tmp_path / "checkpoints"
    foreign = torch.load(folder / "step-000000002.pt", weights_only=True)
    foreign["run_id"], foreign["step"] = "another-run", 9
    torch.save(foreign, folder / "step-000000009.pt")  # a higher step of another run, copied in
    (folder / "step-000000008.pt").write_bytes(b"not a checkpoint")  # unreadable: never ours to delete
    overrides = ["training.max_steps=5", "training.checkpoint_every_n_steps=1", "training.checkpoint_keep_last=1"]
    trainer = Trainer(compose_run(tmp_path, [*overrides, "training.resume=auto"]))
    assert trainer.step == 2
    trainer.fit()
    names = sorted(p.name for p in folder.glob("step-*.pt"))
    assert names == ["step-000000005.pt", "step-000000008.pt", "step-000000009.pt"]
    assert load_training_checkpoint(folder / "last.pt")["step"] == 5


def test_resume_from_a_checkpoint_inside_the_folder_is_allowed(tmp_path, compose_run) -> None:
    Trainer(compose_run(tmp_path, ["training.max_steps=2", "training.checkpoint_every_n_steps=1"])).fit()
    inside = tmp_path / "checkpoints" / "step-000000001.pt"
    trainer = Trainer(compose_run(tmp_path, ["training.max_steps=3", f"training.resume={inside}"]))
    assert trainer.step == 1


def test_run_folders_that_cannot_be_created_are_one_line(tmp_path, cache_dir) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    output_under_file = start(tmp_path / "ok", cache_dir, f"system.paths.output={blocker / 'run'}")
    hydra_under_file = start(tmp_path / "ok2", cache_dir, f"hydra.run.dir={blocker / 'hydra'}")
    code, output = finish(output_under_file)
    assert code == 2 and error_line(output) == (
        f"system.paths.output {blocker / 'run'} cannot be created (Not a directory); choose a folder you can write "
        "(system.paths.output=...)"
    ), output[-3000:]
    code, output = finish(hydra_under_file)
    assert code == 2 and error_line(output) == (
        f"anemo-train: hydra.run.dir {blocker / 'hydra'} cannot be created (Not a directory); choose a folder you "
        "can write"
    ), output[-3000:]


# ---------------------------------------------------------------------------------------- diverging runs
def test_a_diverging_run_stops_naming_the_step_and_keeps_a_loadable_checkpoint(tmp_path, cache_dir) -> None:
    code, output = finish(start(tmp_path / "run", cache_dir, "training.max_steps=50", *DIVERGING))
    assert code == 1, output[-3000:]
    message = error_line(output)
    assert message.startswith(
        "anemo-train failed: TrainingDiverged: training diverged: the loss or gradient norm was not finite in steps "
    ), message
    last = tmp_path / "run" / "checkpoints" / "last.pt"
    state = load_training_checkpoint(last)  # refuses non-finite weights
    assert f"training stopped at step {state['step'] + 1}; the last checkpoint, {last} (step {state['step']})" in (
        message
    )
    assert not (tmp_path / "run" / "inference.pt").exists()
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_more_nonfinite_steps_allowed_stop_later(tmp_path, cache_dir) -> None:
    runs = {limit: start(tmp_path / f"run{limit}", cache_dir, "training.max_steps=50", *DIVERGING,
                         f"training.max_nonfinite_steps={limit}") for limit in (1, 5)}  # fmt: skip
    stops = {}
    for limit, process in runs.items():
        code, output = finish(process)
        assert code == 1, output[-3000:]
        stops[limit] = int(error_line(output).split("training stopped at step ")[1].split(";")[0])
    assert stops[5] == stops[1] + 4


def test_a_nonfinite_step_is_skipped_without_touching_weights_or_optimizer_state(tmp_path, compose_run) -> None:
    trainer = Trainer(compose_run(tmp_path, ["training.max_steps=3"]))
    batch = trainer.prepare_batch(next(iter(trainer.train_loader(0))))
    trainer.train_step(batch)  # one good step: the optimizer has state
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in trainer.optimizer.state.values()]
    poisoned = batch.clone()
    poisoned[:, 0, :5] = float("nan")
    loss = trainer.train_step(poisoned)
    assert not torch.isfinite(loss)
    assert all(torch.equal(weights[k], v) for k, v in trainer.model.state_dict().items())
    assert all(torch.equal(m, s["exp_avg"]) for m, s in zip(moments, trainer.optimizer.state.values(), strict=True))
    assert int(trainer.nonfinite.streak) == 1
    trainer.train_step(batch)
    assert int(trainer.nonfinite.streak) == 0 and trainer.nonfinite.reached() is None


@pytest.mark.parametrize(
    "flags, limit, reached",
    [("fttfttt", 3, 7), ("fttfttt", 2, 3), ("tttt", 4, 4), ("ftftft", 2, None), ("t", 1, 1)],
)
def test_nonfinite_steps_count_consecutive_steps(flags: str, limit: int, reached: int | None) -> None:
    counter = NonFiniteSteps(torch.device("cpu"), limit=limit)
    for flag in flags:
        counter.record(torch.tensor(flag == "t"))
    assert counter.reached() == reached


def test_checkpoints_with_nonfinite_weights_are_refused(tmp_path, compose_run, finished_run) -> None:
    state = torch.load(finished_run / "checkpoints" / "last.pt", weights_only=True)
    name = next(k for k, v in state["model"].items() if v.is_floating_point())
    state["model"][name] = state["model"][name].clone().fill_(float("inf"))
    torch.save(state, tmp_path / "poisoned.pt")
    message = message_of(lambda: load_training_checkpoint(tmp_path / "poisoned.pt"))
    count = state["model"][name].numel()
    assert message == (
        f"{tmp_path / 'poisoned.pt'} is not a usable training checkpoint (training.resume): its weights hold NaN or "
        f"inf ({name}: {count} values); it was written by a run that diverged: use an earlier checkpoint"
    )
    inference = torch.load(finished_run / "inference.pt", weights_only=True)
    name = next(k for k, v in inference["state_dict"].items() if v.is_floating_point())
    inference["state_dict"][name] = inference["state_dict"][name].clone()
    inference["state_dict"][name].view(-1)[:3] = float("nan")
    torch.save(inference, tmp_path / "inference.pt")
    message = message_of(lambda: load_inference_checkpoint(tmp_path / "inference.pt"))
    assert message == (
        f"{tmp_path / 'inference.pt'} is not a usable inference checkpoint: its weights hold NaN or inf ({name}: 3 "
        "values); it was written by a run that diverged: use an earlier checkpoint"
    )


def test_a_forecast_with_nonfinite_values_is_an_error_and_writes_nothing(tmp_path, finished_run, cache_dir) -> None:
    inference = torch.load(finished_run / "inference.pt", weights_only=True)
    for name, tensor in inference["state_dict"].items():
        if "decoder" in name and name.endswith("weight") and tensor.is_floating_point():
            inference["state_dict"][name] = tensor * 1e30  # finite weights, overflowing outputs
    checkpoint = tmp_path / "huge.pt"
    torch.save(inference, checkpoint)
    output = tmp_path / "forecast.zarr"
    dataset = cache_dir / "builtin-v1-seed0.zarr"
    command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={checkpoint}", f"dataset={dataset}",
               f"output={output}", "dates=[2000-11-02T00]", "lead_time=12h", "verify=false",
               f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    env = {**os.environ, "ANEMO_LIKE_CACHE": str(cache_dir)}
    process = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    output_text = process.stdout + process.stderr
    assert process.returncode == 1, output_text[-3000:]
    message = error_line(output_text)
    assert message.startswith("anemo-infer failed: NonFiniteForecast: the forecast from 2000-11-02T00:00:00 holds NaN")
    assert message.endswith(
        f"the model of {checkpoint} does not give finite values from these inputs (a diverged training run, or "
        "inputs unlike its training data): no forecast was written"
    )
    assert not output.exists() and not list(tmp_path.glob(".forecast.zarr.tmp-*"))


# --------------------------------------------------------------------------------------------------- signals
def blocked_dataset(folder: Path) -> Path:
    """A dataset whose metadata is a FIFO: reading it blocks set-up until the test lets it go."""
    path = folder / "blocked.zarr"
    path.mkdir(parents=True)
    os.mkfifo(path / ".zgroup")
    return path


def writer_end_once_read(fifo: Path) -> int:
    """Open ``fifo`` for writing as soon as a reader holds it: the process is then inside set-up."""
    deadline = time.monotonic() + 120
    while True:
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            assert error.errno == errno.ENXIO and time.monotonic() < deadline
            time.sleep(0.02)


@pytest.mark.parametrize("signals", [[signal.SIGTERM], [signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]])
def test_signals_during_set_up_exit_with_one_line(tmp_path, cache_dir, signals) -> None:
    dataset = blocked_dataset(tmp_path)
    process = start(tmp_path / "run", cache_dir, f"data.dataset={dataset}")
    writer = writer_end_once_read(dataset / ".zgroup")
    try:
        for signum in signals:
            process.send_signal(signum)
            time.sleep(0.1)
        code, output = finish(process)
    finally:
        os.close(writer)
    expected = 128 + signals[0]
    assert code == expected, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        f"anemo-train: received {signals[0].name} during set-up: stopped before the work was saved; "
        f"exiting with status {expected}"
    )
    assert output.count("received ") == 1


def test_ctrl_c_during_training_writes_a_checkpoint_and_exits_zero(tmp_path, cache_dir) -> None:
    run_dir = tmp_path / "run"
    process = start(run_dir, cache_dir, "training.max_steps=100000", "training.checkpoint_every_n_steps=1000")
    metrics = run_dir / "metrics.jsonl"
    wait_for(lambda: metrics.exists() and len(metrics.read_text().splitlines()) >= 3)
    process.send_signal(signal.SIGINT)
    code, output = finish(process)
    assert code == 0 and "received SIGINT: stopped after step" in output, output[-3000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert load_training_checkpoint(run_dir / "checkpoints" / "last.pt")["step"] == max(steps)
    assert not list(run_dir.rglob("*.tmp"))


class SignalWhilePickled:
    """Sends SIGTERM to this process while torch.save pickles it: a signal in the middle of an atomic write."""

    def __reduce__(self) -> tuple:
        os.kill(os.getpid(), signal.SIGTERM)
        return (dict, ())


def test_a_signal_during_an_atomic_write_takes_effect_after_it(tmp_path) -> None:
    path = tmp_path / "checkpoint.pt"
    with handling_signals(), pytest.raises(Interrupted) as stopped:
        atomic_torch_save({"weights": torch.arange(1000.0), "marker": SignalWhilePickled()}, path)
    assert stopped.value.signal == signal.SIGTERM and stopped.value.exit_code == 143
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.arange(1000.0))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


FORK_AND_TERMINATE = """
import os, signal, time
from anemo_like.interrupts import handling_signals
with handling_signals():
    child = os.fork()
    if child == 0:
        time.sleep(30)
        os._exit(0)
    time.sleep(0.2)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM)
"""


def test_a_forked_child_keeps_the_signal_behaviour_it_had_before() -> None:
    """Loader workers are forked from the command: SIGTERM still ends them (DataLoader's shutdown relies on it)."""
    done = subprocess.run([sys.executable, "-c", FORK_AND_TERMINATE], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True", done.stdout + done.stderr


class SignalAtTheEnd:
    """A step hook that sends SIGTERM when the loop ends: the signal arrives in the final phase."""

    def step_started(self, index: int) -> None:
        pass

    def close(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def test_a_signal_after_the_last_checkpoint_exits_zero_and_resume_writes_the_rest(tmp_path, compose_run) -> None:
    trainer = Trainer(compose_run(tmp_path, ["training.max_steps=2"]))
    with handling_signals(), pytest.raises(Interrupted) as stopped:
        trainer.fit(hooks=[SignalAtTheEnd()])
    last = tmp_path / "checkpoints" / "last.pt"
    assert stopped.value.report() == (
        "received SIGTERM during the end of the run (final validation and outputs): checkpoint "
        f"{last} holds step 2; training.resume=auto writes the rest; exiting with status 0"
    )
    assert stopped.value.exit_code == 0 and not (tmp_path / "inference.pt").exists()
    Trainer(compose_run(tmp_path, ["training.max_steps=2", "training.resume=auto"])).fit()
    assert (tmp_path / "inference.pt").exists()


def test_stale_temporary_files_are_removed_on_the_next_start(tmp_path, compose_run, finished_run) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(finished_run, run_dir)
    stale = [
        run_dir / "checkpoints" / ".step-000000003.pt.k1ll3d.tmp",
        run_dir / "checkpoints" / ".last.pt.link",
        run_dir / ".inference.pt.x9y8z7.tmp",
    ]
    for path in stale:
        path.write_bytes(b"half a file")
    Trainer(compose_run(run_dir, ["training.max_steps=2", "training.resume=auto"]))
    assert not any(path.exists() for path in stale)
    assert (run_dir / "checkpoints" / "last.pt").exists()

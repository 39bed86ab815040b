"""The SLURM batch scripts, run with bash on CPU with stand-ins for ``srun`` and ``scontrol``: each body must run
its command (train, or forecast from a trained run), and SIGUSR1 before the time limit must end in a checkpoint,
exit 0 and a requeue. Their ``#SBATCH`` lines are checked against what the launcher expects."""

from __future__ import annotations

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
import xarray as xr
from conftest import TINY_MODEL
from distributed_checks import free_port

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "training" / "slurm" / "train.sbatch"
TRAIN_MULTINODE = ROOT / "training" / "slurm" / "train_multinode.sbatch"
INFER = ROOT / "inference" / "slurm" / "infer.sbatch"
INFER_SHARDED = ROOT / "inference" / "slurm" / "infer_sharded.sbatch"
INFER_MULTINODE = ROOT / "inference" / "slurm" / "infer_multinode.sbatch"
ANEMO_INFER = shutil.which("anemo-infer", path=str(Path(sys.executable).parent))
FAKE_SRUN = """#!/bin/bash
# stand-in for srun: drop srun's own options, run the command as task 0 of 1 (exec: signals reach it directly)
while [[ $1 == --* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1 SLURM_JOB_NODELIST=localhost
exec "$@"
"""
FAKE_SRUN_TASKS = """#!/bin/bash
# stand-in for srun with $FAKE_NTASKS tasks on this host: drop srun's options, start every task, wait for all
while [[ $1 == --* ]]; do shift; done
pids=()
for ((task = 0; task < FAKE_NTASKS; task++)); do
    SLURM_PROCID=$task SLURM_LOCALID=$task SLURM_NTASKS=$FAKE_NTASKS SLURM_JOB_NODELIST=localhost "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$SCONTROL_LOG"
"""


def sbatch_options(script: Path) -> dict[str, str]:
    """The script's `#SBATCH --key=value` lines as {key: value} ('' for a flag); `##SBATCH` lines are off."""
    options = {}
    for line in script.read_text().splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.split()[1].removeprefix("--").partition("=")
            options[key] = value
    return options


def run_script(script: Path, tmp_path: Path, variables: dict[str, str], *, srun: str = FAKE_SRUN) -> subprocess.Popen:
    """Start the batch script as SLURM would, with fake srun/scontrol on PATH and the script's EDIT values."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", srun), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SCONTROL_LOG": str(tmp_path / "scontrol.log"),
        "SLURM_JOB_ID": "4242",
        "SLURM_CPUS_PER_TASK": "1",
        **variables,
    }
    return subprocess.Popen(["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def train(script: Path, tmp_path: Path, cache_dir: Path, overrides: list[str]) -> subprocess.Popen:
    """The training script on the built-in dataset with a tiny quickstart model, into tmp_path/run."""
    overrides = [*TINY_MODEL, "diagnostics.plots=false", "system.hardware.num_threads=1", *overrides]
    variables = {
        "CONFIG_NAME": "quickstart",
        "DATASET": "builtin",
        "RUN_DIR": str(tmp_path / "run"),
        "CACHE_DIR": str(cache_dir),
        "ANEMO_LIKE_CACHE": str(cache_dir),
        "PYTHON": sys.executable,
        "EXTRA_OVERRIDES": " ".join(overrides),
    }
    return run_script(script, tmp_path, variables)


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory, cache_dir):
    """trained_run(script) -> (output, return code, folder) of the script's body for 3 steps, once per script."""
    runs = {}

    def run(script: Path) -> tuple[str, int, Path]:
        if script not in runs:
            folder = tmp_path_factory.mktemp(script.stem)
            process = train(script, folder, cache_dir, ["training.max_steps=3"])
            output, _ = process.communicate(timeout=300)
            runs[script] = output, process.returncode, folder
        return runs[script]

    return run


SCRIPTS = [TRAIN, TRAIN_MULTINODE, INFER, INFER_SHARDED, INFER_MULTINODE]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_batch_script_syntax(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("script", [TRAIN, TRAIN_MULTINODE], ids=lambda p: p.name)
def test_training_resource_lines(script):
    options = sbatch_options(script)
    assert options["ntasks-per-node"] == options["gpus-per-node"], "one task per GPU"
    assert int(options["cpus-per-task"]) >= 1 and options["mem"] == "0"
    assert options["signal"] == "B:USR1@300" and "requeue" in options
    assert int(options["nodes"]) == (2 if script == TRAIN_MULTINODE else 1)


def test_inference_resource_lines():
    options = sbatch_options(INFER)
    assert (options["nodes"], options["ntasks"], options["gpus"]) == ("1", "1", "1")
    assert "requeue" not in options


@pytest.mark.parametrize("script", [TRAIN, TRAIN_MULTINODE], ids=lambda p: p.name)
def test_batch_script_body_trains(script, trained_run):
    output, returncode, folder = trained_run(script)
    assert returncode == 0, output[-3000:]
    assert torch.load(folder / "run" / "checkpoints" / "last.pt", weights_only=True)["step"] == 3
    assert (folder / "run" / "inference.pt").exists() and not (folder / "scontrol.log").exists()


@pytest.mark.parametrize("script", [TRAIN, TRAIN_MULTINODE], ids=lambda p: p.name)
def test_sigusr1_before_the_time_limit_checkpoints_and_requeues(script, tmp_path, cache_dir):
    overrides = ["training.max_steps=100000", "training.checkpoint_every_n_steps=1000"]
    process = train(script, tmp_path, cache_dir, overrides)
    run_dir = tmp_path / "run"
    deadline = time.monotonic() + 180
    while len(logged_steps(run_dir)) < 3:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@300` sends to the batch script
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "received SIGUSR1" in output and "requeueing job 4242" in output
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == max(logged_steps(run_dir))


@pytest.mark.skipif(ANEMO_INFER is None, reason="anemo-infer is not installed: pip install -e . (pyproject.toml)")
def test_inference_script_body_forecasts(tmp_path, trained_run):
    output, returncode, folder = trained_run(TRAIN)
    assert returncode == 0, output[-3000:]
    variables = {
        "CONFIG_NAME": "default",
        "CHECKPOINT": str(folder / "run" / "inference.pt"),
        "DATES": "[2000-11-01T00]",
        "OUTPUT_DIR": str(tmp_path / "forecast"),
        "ANEMO_INFER": ANEMO_INFER,
        "EXTRA_OVERRIDES": "lead_time=12h num_threads=1",
    }
    process = run_script(INFER, tmp_path, variables)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    assert (tmp_path / "forecast" / "forecast.nc").exists()


@pytest.mark.parametrize("script", [INFER_SHARDED, INFER_MULTINODE], ids=lambda p: p.name)
def test_sharded_inference_resource_lines(script):
    options = sbatch_options(script)
    assert options["ntasks-per-node"] == options["gpus-per-node"], "one task per GPU"
    assert int(options["nodes"]) == (2 if script == INFER_MULTINODE else 1) and "requeue" not in options


@pytest.mark.skipif(ANEMO_INFER is None, reason="anemo-infer is not installed: pip install -e . (pyproject.toml)")
@pytest.mark.parametrize(("script", "tasks", "per_copy"), [(INFER_SHARDED, 2, 2), (INFER_MULTINODE, 4, 2)],
                         ids=["sharded-2", "multinode-4"])  # fmt: skip
def test_sharded_inference_script_bodies_forecast(script, tasks, per_copy, tmp_path, trained_run):
    output, returncode, folder = trained_run(TRAIN)
    assert returncode == 0, output[-3000:]
    variables = {
        "CHECKPOINT": str(folder / "run" / "inference.pt"),
        "DATES": "[2000-11-01T00,2000-11-02T00,2000-11-03T00]",
        "OUTPUT_DIR": str(tmp_path / "forecast"),
        "NUM_GPUS_PER_MODEL": str(per_copy),
        "ANEMO_INFER": ANEMO_INFER,
        "EXTRA_OVERRIDES": "lead_time=12h device=cpu",
        "FAKE_NTASKS": str(tasks),
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    process = run_script(script, tmp_path, variables, srun=FAKE_SRUN_TASKS)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    copies = tasks // per_copy
    assert f"rank {tasks - 1} of {tasks}: model copy {copies - 1} of {copies}, shard 1 of 2" in output, output[-3000:]
    with xr.open_dataset(tmp_path / "forecast" / "forecast.nc") as forecast:
        assert forecast.sizes["time"] == 3 and forecast.sizes["step"] == 2

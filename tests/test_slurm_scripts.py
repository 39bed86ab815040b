"""The SLURM batch scripts, run with bash on CPU with stand-ins for ``srun`` and ``scontrol``: the body must train,
and SIGUSR1 before the time limit must end in a checkpoint, exit 0 and a requeue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from conftest import TINY_MODEL

SCRIPT = Path(__file__).resolve().parents[1] / "training" / "slurm" / "train.sbatch"
FAKE_SRUN = """#!/bin/bash
# stand-in for srun: drop srun's own options, run the command as task 0 of 1 (exec: signals reach it directly)
while [[ $1 == --* ]]; do shift; done
export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NTASKS=1
exec "$@"
"""
FAKE_SCONTROL = """#!/bin/bash
echo "$@" >> "$SCONTROL_LOG"
"""


def run_script(tmp_path: Path, cache_dir: Path, overrides: list[str]) -> tuple[subprocess.Popen, Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    run_dir, scontrol_log = tmp_path / "run", tmp_path / "scontrol.log"
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CONFIG_NAME": "quickstart",
        "DATASET": "builtin",
        "RUN_DIR": str(run_dir),
        "PYTHON": sys.executable,
        "EXTRA_OVERRIDES": " ".join(
            [*TINY_MODEL, "diagnostics.plots=false", "system.hardware.num_threads=1", *overrides]
        ),
        "ANEMO_LIKE_CACHE": str(cache_dir),
        "SCONTROL_LOG": str(scontrol_log),
        "SLURM_JOB_ID": "4242",
        "SLURM_CPUS_PER_TASK": "1",
    }
    process = subprocess.Popen(
        ["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return process, run_dir, scontrol_log


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def test_batch_script_body_trains(tmp_path, cache_dir):
    process, run_dir, scontrol_log = run_script(tmp_path, cache_dir, ["training.max_steps=3"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 3
    assert (run_dir / "inference.pt").exists() and not scontrol_log.exists()


def test_sigusr1_before_the_time_limit_checkpoints_and_requeues(tmp_path, cache_dir):
    process, run_dir, scontrol_log = run_script(
        tmp_path, cache_dir, ["training.max_steps=100000", "training.checkpoint_every_n_steps=1000"]
    )
    deadline = time.monotonic() + 180
    while len(logged_steps(run_dir)) < 3:
        assert time.monotonic() < deadline and process.poll() is None, process.communicate()[0][-3000:]
        time.sleep(0.05)
    process.send_signal(signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@300` sends to the batch script
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "received SIGUSR1" in output and "requeueing job 4242" in output
    assert scontrol_log.read_text().split() == ["requeue", "4242"]
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == max(logged_steps(run_dir))

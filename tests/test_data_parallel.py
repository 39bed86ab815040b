"""Data parallelism across processes (gloo on CPU), launched with the torchrun environment convention."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_MODEL
from distributed_checks import free_port

from anemo_like.data.builtin import FORCINGS, PROGNOSTIC
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.distributed.environment import first_slurm_host, launch_environment

RUN = [*TINY_MODEL, "system.hardware.num_threads=1", "diagnostics.plots=false", "training.val_every_n_steps=1000"]


def launch(run_dir: Path, cache_dir: Path, overrides: list[str], *, world: int) -> list[subprocess.Popen]:
    """``world`` processes of anemo-train with torchrun's variables (one process: no variables at all)."""
    port = free_port()
    processes = []
    for rank in range(world):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
        if world > 1:
            env.update(
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
        command = [
            sys.executable, "-m", "anemo_like.cli.train", *RUN, *overrides,
            f"system.paths.output={run_dir}", f"system.paths.cache={cache_dir}",
            f"hydra.run.dir={run_dir / f'hydra-{rank}'}",
        ]  # fmt: skip
        processes.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        )
    return processes


def wait_all(processes: list[subprocess.Popen], timeout: float) -> list[tuple[int, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for p in processes:
        output, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        results.append((p.returncode, output))
    return results


def train_losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


@pytest.mark.equivalence
def test_two_ranks_of_batch_one_follow_one_process_of_batch_two(tmp_path, cache_dir):
    steps = ["training.max_steps=6"]
    [(code, output)] = wait_all(
        launch(tmp_path / "one", cache_dir, [*steps, "dataloader.batch_size.train=2"], world=1), 180
    )
    assert code == 0, output[-2000:]
    results = wait_all(launch(tmp_path / "two", cache_dir, [*steps, "dataloader.batch_size.train=1"], world=2), 180)
    for code, output in results:
        assert code == 0, output[-3000:]
    single, parallel = train_losses(tmp_path / "one"), train_losses(tmp_path / "two")
    assert sorted(parallel) == list(range(1, 7))
    np.testing.assert_allclose([parallel[s] for s in sorted(parallel)], [single[s] for s in sorted(single)], rtol=1e-5)
    assert (tmp_path / "two" / "checkpoints" / "last.pt").exists() and (tmp_path / "two" / "inference.pt").exists()


@pytest.fixture
def dataset_with_a_nan(tmp_path) -> Path:
    """The built-in variables on a 8x16 grid, 48 six-hourly dates around the quickstart split; one NaN."""
    rng = np.random.default_rng(0)
    lat = np.repeat(-90 + (np.arange(8) + 0.5) * 22.5, 16)
    lon = np.tile(np.arange(16) * 22.5, 8)
    data = rng.standard_normal((48, len(FORCINGS) + len(PROGNOSTIC), 1, lat.size)).astype(np.float32)
    data[10, len(FORCINGS), 0, 5] = np.nan  # 'sp' at one point of one training date
    dates = np.datetime64("2000-10-25T00:00:00", "s") + np.arange(48) * np.timedelta64(6, "h")
    return write_anemoi_zarr(
        tmp_path / "nan.zarr",
        data=data,
        variables=[*FORCINGS, *PROGNOSTIC],
        dates=dates,
        latitudes=lat,
        longitudes=lon,
        frequency="6h",
    )


@pytest.mark.equivalence
def test_two_instances_of_two_ranks_follow_two_instances_of_one_rank(tmp_path, cache_dir):
    """World 4 = 2 model instances x 2 ranks (sharded: encoder by heads, processor by edges with halos, decoder by
    edges; each rank reads half the grid) trains like world 2 = 2 instances x 1 rank on the same global batch:
    the loss curves and the final validation agree. (Numerics of every strategy: tests/test_model_sharding.py.)"""
    common = ["training.max_steps=4", "dataloader.batch_size.train=1", "training.val_every_n_steps=4"]
    sharded = [
        "system.hardware.num_gpus_per_model=2",
        "model.encoder.shard_strategy=heads",
        "model.processor.shard_strategy=edges",
        "model.decoder.shard_strategy=edges",
    ]
    runs = {
        "2x1": launch(tmp_path / "2x1", cache_dir, common, world=2),
        "2x2": launch(tmp_path / "2x2", cache_dir, [*common, *sharded], world=4),
    }
    for name, processes in runs.items():
        for code, output in wait_all(processes, 300):
            assert code == 0, f"{name}: {output[-3000:]}"
    losses, sharded_losses = train_losses(tmp_path / "2x1"), train_losses(tmp_path / "2x2")
    assert sorted(sharded_losses) == list(range(1, 5))
    np.testing.assert_allclose([sharded_losses[s] for s in range(1, 5)], [losses[s] for s in range(1, 5)], rtol=1e-5)
    assert (tmp_path / "2x2" / "validation.md").read_text() == (tmp_path / "2x1" / "validation.md").read_text()


def test_one_rank_failing_stops_every_rank_with_an_error(tmp_path, cache_dir, dataset_with_a_nan):
    started = time.monotonic()
    processes = launch(
        tmp_path / "run",
        cache_dir,
        [f"data.dataset={dataset_with_a_nan}", "training.max_steps=40", "dataloader.batch_size.train=1"],
        world=2,
    )
    results = wait_all(processes, 120)
    assert time.monotonic() - started < 120
    codes = [code for code, _ in results]
    assert all(code != 0 for code in codes), [output[-1500:] for _, output in results]
    failed_on_data = ["NonFiniteDataError" in output for _, output in results]
    assert sum(failed_on_data) == 1, [output[-1500:] for _, output in results]  # one rank raised ...
    other = results[failed_on_data.index(False)][1]
    assert "anemo-train failed: PeerFailed: rank" in other and "Traceback" not in other  # the other's collective failed


def test_launch_environment_conventions(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    assert launch_environment().world_size == 1
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[003-005,007],cpu1")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    env = launch_environment()
    assert (env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == (3, 1, 8, "gpu003", 29742)
    monkeypatch.setenv("RANK", "1")  # torchrun inside a SLURM job: torchrun's variables win
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "1234")
    env = launch_environment()
    assert (env.rank, env.world_size, env.master_port) == (1, 2, 1234)
    assert first_slurm_host("node17") == "node17"


def test_sigterm_stops_every_rank_at_the_same_step_with_a_checkpoint(tmp_path, cache_dir):
    import signal

    import torch

    run = tmp_path / "run"
    processes = launch(run, cache_dir, ["training.max_steps=100000", "training.checkpoint_every_n_steps=1000"], world=2)
    deadline = time.monotonic() + 120
    while not ((run / "metrics.jsonl").exists() and len(train_losses(run)) >= 3):
        assert time.monotonic() < deadline and all(p.poll() is None for p in processes)
        time.sleep(0.05)
    processes[1].send_signal(signal.SIGTERM)  # SLURM signals every task; one is enough to stop them all
    results = wait_all(processes, 60)
    assert [code for code, _ in results] == [0, 0], [output[-1500:] for _, output in results]
    stopped_at = max(train_losses(run))
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["step"] == stopped_at
    assert "received SIGTERM" in results[1][1] and "a stop signal on another rank" in results[0][1]


def test_a_non_integer_launch_variable_is_named(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_PORT", "http")
    with pytest.raises(ValueError, match=r"^environment variable MASTER_PORT='http' is not an integer port$"):
        launch_environment()


def test_torchrun_trains_a_model_sharded_over_two_processes(tmp_path, cache_dir):
    """The documented command: ``torchrun --nproc_per_node=2 -m anemo_like.cli.train ... num_gpus_per_model=2``,
    here with a frozen encoder and a weight average: the sharded run ends with the weights of one process."""
    torchrun = Path(sys.executable).with_name("torchrun")
    run_dir = tmp_path / "run"
    recipe = ["training.max_steps=3", "training.freeze=[encoder]", "training.ema.decay=0.5"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SLURM_PROCID")}
    command = [
        str(torchrun), "--nproc_per_node=2", f"--master_port={free_port()}", "-m", "anemo_like.cli.train",
        *RUN, *recipe, "system.hardware.num_gpus_per_model=2",
        f"system.paths.output={run_dir}", f"system.paths.cache={cache_dir}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    assert "2 ranks: 1 model instance(s) of 2 rank(s)" in output
    assert sorted(train_losses(run_dir)) == [1, 2, 3]
    assert (run_dir / "inference.pt").exists() and (run_dir / "validation.md").exists()
    [(code, output)] = wait_all(launch(tmp_path / "one", cache_dir, recipe, world=1), 180)
    assert code == 0, output[-2000:]
    sharded, single = (
        torch.load(d / "inference.pt", weights_only=True)["state_dict"] for d in (run_dir, tmp_path / "one")
    )
    for name, value in single.items():
        torch.testing.assert_close(sharded[name], value, rtol=1e-5, atol=1e-6, msg=name)
    trained = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]  # not averaged
    assert all(torch.equal(trained[n], v) for n, v in sharded.items() if n.startswith("encoder."))  # frozen
    assert any(not torch.equal(trained[n], v) for n, v in sharded.items() if n.startswith("decoder."))  # averaged

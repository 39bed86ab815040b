"""Throughput knobs: every dataloader option reaches the DataLoader, workers split the samples exactly, batches
normalised on the device equal the workers' normalisation, the fused optimiser and its fallback, CUDA graphs
refused on a CPU, no host-device syncs between logging steps, and ``anemo-bench``."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import TINY_MODEL
from torch.overrides import TorchFunctionMode
from torch.utils.data import Dataset, get_worker_info

from anemo_like.config.schema import OptimizerConfig, RunConfig
from anemo_like.data.setup import DataSetup, LoaderOptions, setup_data
from anemo_like.profiling.throughput import diagnose
from anemo_like.training.optimizer import build_adamw
from anemo_like.training.trainer import Trainer


class _RecordingSamples(Dataset):
    """Item i -> (i, id of the worker that read it; -1 in the main process)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, item: int) -> torch.Tensor:
        info = get_worker_info()
        return torch.tensor([item, -1 if info is None else info.id])


def test_every_dataloader_knob_reaches_the_dataloader(tmp_path, compose_run) -> None:
    config = compose_run(
        tmp_path,
        [
            "dataloader.num_workers.train=2",
            "dataloader.num_workers.val=1",
            "dataloader.batch_size.train=3",
            "dataloader.batch_size.val=5",
            "dataloader.prefetch_factor=3",
            "dataloader.persistent_workers=false",
            "dataloader.limit_batches.train=4",
            "dataloader.normalize_on_device=true",
        ],
    )
    data = setup_data(config)
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    train = data.train_loader(
        LoaderOptions.for_split(config.dataloader, "train", cpu), seed=0, start_sample=0, limit_batches=4
    )
    assert (train.batch_size, train.num_workers, train.prefetch_factor) == (3, 2, 3)
    assert not train.persistent_workers and not train.pin_memory  # pinning needs an accelerator
    assert train.sampler.pass_length == 12 and not train.dataset.normalize
    stream = iter(train.sampler)  # limit_batches.train: passes of 4 global batches, each freshly shuffled
    passes = [[next(stream) for _ in range(12)] for _ in range(2)]
    assert all(len(set(p)) == 12 for p in passes) and set(passes[0]) != set(passes[1])
    val = data.val_loader(LoaderOptions.for_split(config.dataloader, "val", cpu))
    assert (val.batch_size, val.num_workers, val.prefetch_factor, val.persistent_workers) == (5, 1, 3, False)
    assert LoaderOptions.for_split(config.dataloader, "train", cuda).pin_memory  # on a GPU it pins
    # defaults: 2 batches ahead per worker and persistent workers where there are workers, nothing without
    defaults = compose_run(tmp_path, ["dataloader.num_workers.train=1"]).dataloader
    assert LoaderOptions.for_split(defaults, "train", cpu) == LoaderOptions(2, 1, 2, False, True)
    assert LoaderOptions.for_split(defaults, "val", cpu) == LoaderOptions(16, 0, None, False, False)


def _read_with_workers(data: DataSetup, *, batch: int, batches: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    loader = data.train_loader(
        LoaderOptions(batch_size=batch, num_workers=2, prefetch_factor=2),
        seed=3,
        start_sample=0,
        rank=rank,
        world_size=world,
    )
    stream = iter(loader)
    return torch.cat([next(stream) for _ in range(batches)])  # (samples, 2): item, worker


@pytest.mark.parametrize("world", [1, 2])
def test_workers_read_disjoint_samples_that_cover_the_epoch_once(tmp_path, compose_run, world: int) -> None:
    data = setup_data(compose_run(tmp_path, []))
    data.train = _RecordingSamples(24)
    read = torch.cat([_read_with_workers(data, batch=3, batches=8 // world, rank=r, world=world) for r in range(world)])
    items, workers = read[:, 0], read[:, 1]
    assert sorted(items.tolist()) == list(range(24))  # one epoch: every sample exactly once, over all ranks
    assert set(workers.tolist()) == {0, 1}  # both workers read, and a sample is read by one worker only


def test_normalising_on_the_device_equals_normalising_in_the_workers(tmp_path, compose_run) -> None:
    on_device = setup_data(compose_run(tmp_path, ["dataloader.normalize_on_device=true"]))
    in_worker = setup_data(compose_run(tmp_path, []))
    raw = torch.stack([on_device.train[i] for i in (0, 7)])
    assert not torch.allclose(raw, torch.stack([in_worker.train[i] for i in (0, 7)]))
    normalised = on_device.device_normalizer(torch.device("cpu"))(raw.clone())
    torch.testing.assert_close(normalised, torch.stack([in_worker.train[i] for i in (0, 7)]), rtol=1e-5, atol=1e-5)
    assert in_worker.device_normalizer(torch.device("cpu")) is None


def test_fused_adamw_where_supported_else_foreach_with_a_log_line(monkeypatch, caplog) -> None:
    params = [torch.nn.Parameter(torch.randn(4))]
    assert build_adamw(params, OptimizerConfig()).defaults["fused"]  # torch has fused AdamW kernels for CPUs too
    assert not build_adamw(params, OptimizerConfig(fused=False)).defaults["fused"]
    adamw = torch.optim.AdamW

    def no_fused_kernels(parameters, **kwargs):
        if kwargs.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be floating point Tensors of supported devices")
        return adamw(parameters, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", no_fused_kernels)
    with caplog.at_level(logging.INFO, logger="anemo_like.training.optimizer"):
        optimizer = build_adamw(params, OptimizerConfig())
    assert optimizer.defaults["foreach"] and not optimizer.defaults["fused"]
    assert "fused AdamW unavailable here (`fused=True` requires" in caplog.text and "using foreach AdamW" in caplog.text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_graphs_are_refused_on_a_cpu(tmp_path, compose_run) -> None:
    with pytest.raises(ValueError, match=r"training\.cuda_graphs=true: it needs a CUDA device and this run is on cpu"):
        Trainer(compose_run(tmp_path, ["training.cuda_graphs=true"]))


_SYNCING = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "nonzero", "synchronize"}


class _SyncCounter(TorchFunctionMode):
    """Records the training step of every tensor call that would wait for a GPU (reading a value on the host)."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__()
        self.trainer = trainer
        self.steps: list[tuple[int, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in _SYNCING and not _in_sampler():
            self.steps.append((self.trainer.step, name))
        return func(*args, **(kwargs or {}))


def _in_sampler() -> bool:
    """The sampler draws its permutation on the host once per pass: a CPU tensor by design, never a device one."""
    frame = sys._getframe()
    while frame is not None:
        if frame.f_code.co_name == "_global_stream":
            return True
        frame = frame.f_back
    return False


def test_the_training_step_reads_nothing_from_the_device_between_logging_steps(tmp_path, compose_run) -> None:
    config = compose_run(
        tmp_path,
        [
            "training.max_steps=12",
            "diagnostics.log_every_n_steps=4",
            "training.val_every_n_steps=100",
            "training.checkpoint_every_n_steps=100",
            "diagnostics.plots=false",
            "training.val_climatology_dates=0",
        ],
    )
    trainer = Trainer(config)
    with _SyncCounter(trainer) as counter:
        trainer.fit()
    # step 0 is the set-up and the first step, which builds and caches the graph's chunk plans once
    syncing_steps = {step for step, _ in counter.steps} - {0}
    assert 4 in syncing_steps and 8 in syncing_steps  # the counter sees the metrics being read
    assert syncing_steps <= {4, 8, 12}, counter.steps  # 12: the last step, with validation and checkpoint


def _diagnosis(rates: dict[str, float], config: RunConfig, device: str = "cpu", cores: int = 16) -> str:
    result = diagnose(rates, config, device=torch.device(device), cores=cores)
    return f"{result.bound}: {result.advice}"


def test_diagnosis_names_the_bound_and_the_next_knob(tmp_path, compose_run) -> None:
    config = compose_run(tmp_path, [])
    io_bound = _diagnosis({"io": 5.0, "synthetic": 20.0, "full": 5.0}, config)
    assert io_bound == (
        "io: IO 5 < SYNTHETIC 20 samples/s: raise dataloader.num_workers.train from 0 to 1; this machine has 16 cores"
    )
    with_workers = compose_run(tmp_path, ["dataloader.num_workers.train=4"])
    assert "from 4 to 8" in _diagnosis({"io": 5.0, "synthetic": 20.0, "full": 5.0}, with_workers)
    assert "normalize_on_device=true" in _diagnosis({"io": 5.0, "synthetic": 20.0}, with_workers, cores=4)
    serial = _diagnosis({"io": 50.0, "synthetic": 20.0, "full": 14.0}, config)
    assert serial == (
        "overlap: IO 50 vs SYNTHETIC 20 samples/s: reading between steps costs 40 % of each step; "
        "set dataloader.num_workers.train=1 so reading overlaps compute"
    )
    # reading costs 3 % of a step: FULL below SYNTHETIC is noise, not a reason for a worker on a busy machine
    assert _diagnosis({"io": 300.0, "synthetic": 9.0, "full": 7.4}, config).startswith("compute: ")
    competing = _diagnosis({"io": 50.0, "synthetic": 20.0, "full": 12.0}, with_workers, cores=2)
    assert competing.startswith("overlap: FULL 12 < SYNTHETIC 20 samples/s although IO is 50: the 4 workers compete")
    assert "precision=bf16-mixed" in _diagnosis({"io": 500.0, "synthetic": 20.0, "full": 19.0}, config, "cuda")
    assert _diagnosis({"io": 500.0, "synthetic": 20.0, "full": 19.0}, config).startswith("compute: ")


def test_anemo_bench_prints_three_throughputs_and_a_verdict(tmp_path, cache_dir) -> None:
    command = [
        sys.executable,
        "-m",
        "anemo_like.cli.bench",
        "--config-name=quickstart",
        *TINY_MODEL,
        "diagnostics.bench.warmup_batches=1",
        "diagnostics.bench.batches=3",
        "training.val_climatology_dates=0",
        f"system.paths.cache={cache_dir}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(record[f"{mode}_samples_per_s"] > 0 for mode in ("io", "synthetic", "full"))
    assert record["bound"] in {"io", "compute", "overlap"} and record["advice"]
    assert json.loads(Path(tmp_path / "run" / "bench.json").read_text()) == record
    assert all(f"\n{line}" in done.stdout for line in ("  IO ", "  SYNTHETIC ", "  FULL ", "bound: ", "next: "))


@pytest.mark.parametrize("precision", ["32", "bf16-mixed", "16-mixed", "bf16"])
def test_each_precision_trains_with_finite_decreasing_loss(tmp_path, compose_run, precision: str) -> None:
    config = compose_run(
        tmp_path,
        [
            f"training.precision={precision}",
            "training.max_steps=16",
            "training.optimizer.warmup_steps=2",
            "training.val_every_n_steps=100",
            "training.val_climatology_dates=0",
            "diagnostics.plots=false",
        ],
    )
    trainer = Trainer(config)
    assert next(trainer.model.parameters()).dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
    assert (trainer.precision.scaler is not None) == (precision == "16-mixed")
    trainer.fit()
    losses = [json.loads(line)["train_loss"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()[:16]]
    assert len(losses) == 16 and all(map(math.isfinite, losses)), losses
    assert sum(losses[-4:]) < 0.8 * sum(losses[:4]), losses

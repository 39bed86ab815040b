"""``anemo-bench``: one config's training throughput in three modes, to tell data loading from compute.

- io: the dataloader alone; batches pulled and made ready on the device (copy, gather, normalisation);
- synthetic: training steps on one batch already on the device (the compute ceiling);
- full: normal training, loader and steps together.

Each mode runs ``diagnostics.bench.warmup_batches`` untimed, then ``batches`` timed, and reports samples per
second of one model instance. :func:`diagnose` names the bound and the one knob most worth turning next.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from anemo_like.config.schema import RunConfig
from anemo_like.training.trainer import Trainer

SLOWER = 0.85  # with workers, full is "slower than synthetic" below this share of it: loading is not hidden
READ_SHARE = 0.10  # without workers, reading in the training process is worth a worker above this share of a step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(run_batch: Callable[[], object], *, warmup: int, batches: int, device: torch.device) -> float:
    """Seconds for ``batches`` calls of ``run_batch`` after ``warmup`` untimed ones."""
    for _ in range(warmup):
        run_batch()
    _sync(device)
    start = time.perf_counter()
    for _ in range(batches):
        run_batch()
    _sync(device)
    return time.perf_counter() - start


def _batch_runner(trainer: Trainer, mode: str) -> Callable[[], object]:
    """One batch of ``mode``: io reads and prepares a batch; synthetic steps on a cached one; full does both."""
    stream = iter(trainer.train_loader(start_sample=0))
    if mode == "io":
        return lambda: trainer.prepare_train_batch(next(stream))
    if mode == "synthetic":
        cached = trainer.prepare_train_batch(next(stream))
        return lambda: trainer.train_step(cached)
    return lambda: trainer.train_step(trainer.prepare_train_batch(next(stream)))


def measure_throughput(trainer: Trainer) -> dict[str, float]:
    """Samples per second per mode in ``diagnostics.bench.modes`` (keys io, synthetic, full)."""
    cfg = trainer.config
    bench = cfg.diagnostics.bench
    samples = bench.batches * cfg.dataloader.batch_size.train
    trainer.model.train()
    rates: dict[str, float] = {}
    for mode in bench.modes:
        run_batch = _batch_runner(trainer, mode)
        seconds = _timed(run_batch, warmup=bench.warmup_batches, batches=bench.batches, device=trainer.device)
        rates[mode] = samples / seconds
    return rates


def available_cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@dataclass(frozen=True)
class Diagnosis:
    bound: str  # "io", "compute", "overlap" (each alone is fast enough, together they are not) or "unknown"
    advice: str  # the one next knob, with the figures behind it


def diagnose(rates: dict[str, float], config: RunConfig, *, device: torch.device, cores: int) -> Diagnosis:
    """Which stage limits training, and the single most useful next knob."""
    io, synthetic, full = rates.get("io"), rates.get("synthetic"), rates.get("full")
    if io is None or synthetic is None:
        return Diagnosis("unknown", "run the io and synthetic modes to compare loading with compute")
    loader = config.dataloader
    workers = loader.num_workers.train
    if io < synthetic:
        figures = f"IO {io:.3g} < SYNTHETIC {synthetic:.3g} samples/s"
        spare = max(1, cores - 1)  # one core for the training process itself
        if workers < spare:
            more = min(spare, max(1, 2 * workers))
            return Diagnosis(
                "io",
                f"{figures}: raise dataloader.num_workers.train from {workers} to {more}; this machine has "
                f"{cores} cores",
            )
        if not loader.normalize_on_device:
            return Diagnosis(
                "io", f"{figures} with {workers} workers on {cores} cores: set dataloader.normalize_on_device=true"
            )
        return Diagnosis(
            "io",
            f"{figures} with {workers} workers on {cores} cores: reads are the limit; move the dataset to faster "
            "storage, or shard reads with system.hardware.num_gpus_per_model and dataloader.read_group_size",
        )
    if workers == 0 and synthetic / io > READ_SHARE:
        return Diagnosis(
            "overlap",
            f"IO {io:.3g} vs SYNTHETIC {synthetic:.3g} samples/s: reading between steps costs "
            f"{100 * synthetic / io:.0f} % of each step; set dataloader.num_workers.train=1 so reading overlaps "
            "compute",
        )
    if workers and full is not None and full < SLOWER * synthetic:
        figures = f"FULL {full:.3g} < SYNTHETIC {synthetic:.3g} samples/s although IO is {io:.3g}"
        if device.type == "cuda" and not loader.pin_memory:
            return Diagnosis("overlap", f"{figures}: set dataloader.pin_memory=true for asynchronous copies")
        return Diagnosis(
            "overlap",
            f"{figures}: the {workers} workers compete with training for {cores} cores; try "
            f"dataloader.num_workers.train={workers // 2} or dataloader.normalize_on_device=true",
        )
    figures = f"SYNTHETIC {synthetic:.3g} <= IO {io:.3g} samples/s"
    precision = config.training.precision
    if device.type == "cuda" and precision in ("32", "tf32"):
        return Diagnosis("compute", f"{figures}: compute-bound; set training.precision=bf16-mixed")
    return Diagnosis(
        "compute",
        f"{figures}: compute-bound and the loader keeps up; run anemo-profile --doctor for the model's memory and "
        "speed knobs",
    )

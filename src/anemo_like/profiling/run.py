"""``anemo-profile``: a short training run measured phase by phase, then under torch.profiler, into a report.

Order: ``warmup_steps`` untimed steps; ``steps`` steps with the phase clock and the memory sampler (clean
timings, no profiler overhead); ``profiled_steps`` under torch.profiler (operator tables, trace, memory
timeline); then the dataloader alone for ``loader_batches`` batches. The same training step as ``anemo-train``
runs throughout (``Trainer.train_step``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from anemo_like.config.schema import RunConfig
from anemo_like.distributed.environment import launch_rank
from anemo_like.profiling.live_tensors import LiveTensorTracker
from anemo_like.profiling.operators import profile_steps
from anemo_like.profiling.phases import instrument_components
from anemo_like.profiling.report import ProfileReport, write_report
from anemo_like.profiling.sampler import MemorySampler
from anemo_like.profiling.snapshot import MemorySnapshotRecorder, cuda_history_unavailable
from anemo_like.profiling.system_info import system_info
from anemo_like.training.trainer import Trainer

LOG = logging.getLogger(__name__)


def _training_batches(trainer: Trainer) -> Iterator[torch.Tensor]:
    """A fresh iterator over the run's training batches from the first sample (the sampler never ends)."""
    return iter(trainer.train_loader(start_sample=0))


def parameters_per_component(model: torch.nn.Module) -> dict[str, int]:
    counts = {name: sum(p.numel() for p in child.parameters()) for name, child in model.named_children()}
    return {**{k: v for k, v in counts.items() if v}, "total": sum(p.numel() for p in model.parameters())}


def loader_batches_per_second(trainer: Trainer, batches: int) -> float:
    """Rate of the training dataloader alone (fresh iterator, worker start-up included)."""
    stream = _training_batches(trainer)
    start = time.perf_counter()
    for _ in range(batches):
        next(stream)
    return batches / (time.perf_counter() - start)


def report_dir(config: RunConfig, rank: int, run_dir: Path) -> Path | None:
    """Where this rank writes its report, or None when only rank 0 reports and this is another rank."""
    settings = config.diagnostics.profile
    base = Path(settings.output or run_dir / "profile").expanduser()
    if settings.all_ranks:
        return base / f"rank{rank}"
    return base if rank == 0 else None


def profile_training(config: RunConfig, *, trainer: Trainer) -> ProfileReport | None:
    """Profile ``trainer`` (built from ``config``) and write the report; returns it (None on ranks that do not
    report)."""
    rank = launch_rank()
    output = report_dir(config, rank, trainer.run_dir)
    settings = config.diagnostics.profile
    clock, device = trainer.clock, trainer.device
    instrument_components(trainer.model, clock)
    batch_size = config.dataloader.batch_size.train
    stream = _training_batches(trainer)
    trainer.model.train()

    def run_step() -> None:
        clock.start_step("data loading")
        batch = next(stream)
        clock.switch("host to device")
        trainer.train_step(trainer.prepare_train_batch(batch))
        trainer.step += 1
        clock.switch(None)

    for _ in range(settings.warmup_steps):
        run_step()
    clock.recording = True
    with MemorySampler(device, phase_of=lambda: clock.current) as sampler:
        start = time.perf_counter()
        for _ in range(settings.steps):
            run_step()
        timed_seconds = time.perf_counter() - start
    if device.type != "cuda":  # tensor peaks per phase: one step with every operator's outputs tracked
        with LiveTensorTracker() as tracker:
            clock.track_tensors(tracker)
            run_step()
        clock.track_tensors(None)
    clock.recording = False
    allocator = None
    if device.type == "cuda":  # one more step for the caching allocator's reserved-versus-allocated peak
        torch.cuda.reset_peak_memory_stats(device)
        run_step()
        allocator = {
            "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20,
            "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
        }
    if output is None:  # a rank that does not report still runs every step the reporting ranks run (collectives)
        for _ in range(settings.profiled_steps + (cuda_history_unavailable(device) is None)):
            run_step()
        return None
    output.mkdir(parents=True, exist_ok=True)
    LOG.info("profiling %d steps under torch.profiler", settings.profiled_steps)
    profiled = profile_steps(run_step, settings.profiled_steps, output, device)
    LOG.info("reading %d batches with the dataloader alone", settings.loader_batches)
    report = ProfileReport(
        output=output,
        config=config,
        rank=rank,
        device=str(device),
        phases=clock.per_step(),
        steps=settings.steps,
        samples_per_second=settings.steps * batch_size / timed_seconds,
        loader_batches_per_second=loader_batches_per_second(trainer, settings.loader_batches),
        parameters=parameters_per_component(trainer.model),
        memory_samples=sampler.samples,
        memory_source=sampler.source,
        allocator=allocator,
        snapshot_fallback=cuda_history_unavailable(device),
        profiled=profiled,
        system=system_info(),
    )
    if report.snapshot_fallback is None:  # one more step with the CUDA allocator history recorded
        recorder = MemorySnapshotRecorder(
            device=device,
            output_dir=output,
            warmup=0,
            steps=1,
            max_entries=config.diagnostics.memory_snapshot.max_entries,
        )
        recorder.step_started(0)
        run_step()
        recorder.close()
    write_report(report, output)
    return report

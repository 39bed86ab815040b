"""``anemo-profile``: a short training run measured phase by phase, then under torch.profiler, into a report.

Order: ``warmup_steps`` untimed steps; ``steps`` steps with the phase clock and the memory sampler (clean
timings, no profiler overhead); one more step for the tensor peaks per phase (CPU: every operator's outputs
tracked) or for the allocator's reserved-versus-allocated peak (CUDA); ``profiled_steps`` under torch.profiler
(operator tables, trace, memory timeline); the dataloader alone for ``loader_batches`` batches; on CUDA one last
step with the allocator history recorded. The same training step as ``anemo-train`` runs throughout
(``Trainer.train_step``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from anemo_like.config.schema import RunConfig
from anemo_like.diagnostics.live_tensors import LiveTensorTracker
from anemo_like.diagnostics.phases import instrument_components
from anemo_like.diagnostics.sampler import MemorySampler
from anemo_like.diagnostics.snapshot import MemorySnapshotRecorder, cuda_history_unavailable
from anemo_like.distributed.environment import launch_rank
from anemo_like.profiling.operators import ProfiledSteps, profile_steps
from anemo_like.profiling.report import ProfileReport, write_report
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


def _step_runner(trainer: Trainer) -> Callable[[], None]:
    """One training step as ``anemo-train`` runs it, each part on the phase clock (which records only when on)."""
    clock, stream = trainer.clock, _training_batches(trainer)

    def run_step() -> None:
        clock.start_step("data loading")
        batch = next(stream)
        clock.switch("host to device")
        trainer.train_step(trainer.prepare_train_batch(batch))
        trainer.step += 1
        clock.switch(None)

    return run_step


def _timed_steps(trainer: Trainer, run_step: Callable[[], None], steps: int) -> tuple[MemorySampler, float]:
    """``steps`` steps on the phase clock with memory sampled; the sampler and their wall seconds."""
    with MemorySampler(trainer.device, phase_of=lambda: trainer.clock.current) as sampler:
        start = time.perf_counter()
        for _ in range(steps):
            run_step()
        seconds = time.perf_counter() - start
    return sampler, seconds


def _tracked_tensor_step(trainer: Trainer, run_step: Callable[[], None]) -> None:
    """CPU: one step with every operator's outputs tracked, for the tensor peak of each phase (CUDA reads it from
    the allocator in the timed steps)."""
    with LiveTensorTracker() as tracker:
        trainer.clock.track_tensors(tracker)
        run_step()
    trainer.clock.track_tensors(None)


def _allocator_peaks(device: torch.device, run_step: Callable[[], None]) -> dict[str, float]:
    """CUDA: one step for the caching allocator's peak reserved and allocated MiB."""
    torch.cuda.reset_peak_memory_stats(device)
    run_step()
    return {
        "peak_reserved_mib": torch.cuda.max_memory_reserved(device) / 2**20,
        "peak_allocated_mib": torch.cuda.max_memory_allocated(device) / 2**20,
    }


def _snapshot_step(trainer: Trainer, run_step: Callable[[], None], output: Path) -> None:
    """CUDA: one step with the allocator history recorded into ``output`` (``memory_snapshot.pickle``)."""
    recorder = MemorySnapshotRecorder(
        device=trainer.device,
        output_dir=output,
        warmup=0,
        steps=1,
        max_entries=trainer.config.diagnostics.memory_snapshot.max_entries,
    )
    recorder.step_started(0)
    run_step()
    recorder.close()


def _measured_steps(trainer: Trainer, run_step: Callable[[], None]) -> tuple[MemorySampler, float, dict | None]:
    """Warm-up, then the timed steps and one step for tensor (CPU) or allocator (CUDA) peaks: the memory
    sampler, the timed steps' wall seconds and the allocator peaks (CUDA; None on CPU)."""
    settings, device = trainer.config.diagnostics.profile, trainer.device
    for _ in range(settings.warmup_steps):
        run_step()
    trainer.clock.recording = True
    sampler, timed_seconds = _timed_steps(trainer, run_step, settings.steps)
    if device.type != "cuda":
        _tracked_tensor_step(trainer, run_step)
    trainer.clock.recording = False
    allocator = _allocator_peaks(device, run_step) if device.type == "cuda" else None
    return sampler, timed_seconds, allocator


def profile_training(config: RunConfig, *, trainer: Trainer) -> ProfileReport | None:
    """Profile ``trainer`` and write the report; returns it (None on ranks that do not report).

    Everything is read from ``trainer.config``, the copy of ``config`` with every ``num_chunks: auto`` resolved;
    the report carries that copy, so ``report.config`` is the one to hand the doctor.
    """
    config = trainer.config  # the argument, as composed, may still say ``auto``: only the resolved copy travels on
    device, rank = trainer.device, launch_rank()
    settings, output = config.diagnostics.profile, report_dir(config, rank, trainer.run_dir)
    instrument_components(trainer.model, trainer.clock)
    trainer.model.train()
    run_step = _step_runner(trainer)
    sampler, timed_seconds, allocator = _measured_steps(trainer, run_step)
    if output is None:  # a rank that does not report still runs every step the reporting ranks run (collectives)
        for _ in range(settings.profiled_steps + (cuda_history_unavailable(device) is None)):
            run_step()
        return None
    output.mkdir(parents=True, exist_ok=True)
    if settings.profiled_steps:
        LOG.info("profiling %d steps under torch.profiler", settings.profiled_steps)
        profiled = profile_steps(run_step, settings.profiled_steps, output, device)
    else:
        profiled = ProfiledSteps([], None, None, "torch.profiler not run (diagnostics.profile.profiled_steps=0)")
    LOG.info("reading %d batches with the dataloader alone", settings.loader_batches)
    report = ProfileReport(
        output=output,
        config=config,
        rank=rank,
        device=str(device),
        phases=trainer.clock.per_step(),
        steps=settings.steps,
        samples_per_second=settings.steps * config.dataloader.batch_size.train / timed_seconds,
        loader_batches_per_second=loader_batches_per_second(trainer, settings.loader_batches),
        parameters=parameters_per_component(trainer.model),
        memory_samples=sampler.samples,
        memory_source=sampler.source,
        allocator=allocator,
        snapshot_fallback=cuda_history_unavailable(device),
        profiled=profiled,
        system=system_info(),
    )
    if report.snapshot_fallback is None:
        _snapshot_step(trainer, run_step, output)
    write_report(report, output)
    return report

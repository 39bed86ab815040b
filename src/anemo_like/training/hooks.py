"""What runs beside the training loop at every step: the :class:`StepHook` protocol and the hooks a config asks for."""

from __future__ import annotations

from typing import Protocol

from anemo_like.diagnostics.snapshot import MemorySnapshotRecorder
from anemo_like.training.plan_check import MemoryPlanCheck
from anemo_like.training.setup import Run


class StepHook(Protocol):
    """Called by :meth:`Trainer.fit` before each step (``index`` counts from the first step of this fit) and once
    when the loop ends, on every exit path."""

    def step_started(self, index: int) -> None: ...

    def close(self) -> None: ...


def default_hooks(run: Run) -> list[StepHook]:
    """The hooks ``run`` asks for: the memory plan's check (rank 0, when a plan resolved ``auto`` settings) and the
    memory snapshot recorder (``diagnostics.memory_snapshot``, into the run folder)."""
    hooks: list[StepHook] = []
    device = run.placement.device
    if run.memory_plan is not None and run.placement.is_main:
        hooks.append(MemoryPlanCheck(plan=run.memory_plan, device=device, before_model_mib=run.memory_before_model_mib))
    snapshot = run.config.diagnostics.memory_snapshot
    if snapshot.enabled:
        hooks.append(
            MemorySnapshotRecorder(
                device=device,
                output_dir=run.placement.run_dir / "memory_snapshot",
                warmup=snapshot.warmup,
                steps=snapshot.steps,
                max_entries=snapshot.max_entries,
            )
        )
    return hooks

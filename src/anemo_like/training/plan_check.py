"""The memory plan's predicted peak beside the measured one, logged once the first steps ran."""

from __future__ import annotations

import logging

import torch

from anemo_like.runtime.memory_plan import MemoryPlan
from anemo_like.runtime.process_memory import peak_memory_mib

LOG = logging.getLogger(__name__)

STEPS_BEFORE_CHECK = 2
"""Steps before the measurement: the first step also builds chunk plans, scratch buffers and optimizer state."""


class MemoryPlanCheck:
    """A step hook: after :data:`STEPS_BEFORE_CHECK` steps, logs the plan's predicted peak step memory and the
    measured one (CUDA: peak allocated above what was allocated before the model was built; CPU: peak resident
    memory above the resident memory then, when the steps set the process's peak)."""

    def __init__(self, *, plan: MemoryPlan, device: torch.device, before_model_mib: tuple[float, float]) -> None:
        self.plan, self.device = plan, device
        self.in_use_before, self.peak_before = before_model_mib
        self.done = False

    def step_started(self, index: int) -> None:
        if index == STEPS_BEFORE_CHECK and not self.done:
            self.report(index)

    def close(self) -> None:
        self.done = True

    def report(self, steps: int) -> None:
        self.done = True
        predicted = self.plan.peak_bytes / 2**20
        peak = peak_memory_mib(self.device)
        if peak is None or (self.device.type != "cuda" and peak <= self.peak_before):
            LOG.info(
                "memory plan check: predicted peak step memory %.0f MiB; not measured (on CPU the process's peak %s "
                "before the model was built, e.g. building the graph)",
                predicted,
                "is unknown" if peak is None else f"of {peak:.0f} MiB was reached",
            )
            return
        measured = peak - self.in_use_before
        source = "CUDA peak allocated" if self.device.type == "cuda" else "peak resident memory"
        LOG.info(
            "memory plan check: predicted peak step memory %.0f MiB, measured %.0f MiB (%.2fx the prediction) over "
            "%d steps (%s above the memory in use before the model was built)",
            predicted,
            measured,
            measured / predicted if predicted > 0 else float("nan"),
            steps,
            source,
        )

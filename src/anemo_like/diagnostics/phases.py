"""Per-phase wall time, CPU time and peak memory of training steps.

A ``PhaseClock`` attributes everything between two ``switch`` calls to the phase named by the first. The
training step switches at its own boundaries (data loading, host to device, loss, backward, optimizer step);
``instrument_components`` adds forward hooks on the encoder, processor and decoder, and gradient hooks on
their outputs, so forward and backward are split by component (the gradient of a component's output is ready
exactly when backward enters that component). Backward of a checkpointed component includes its
recomputation.

Memory per phase, two ways. Process memory: the peak during the phase, on CUDA the allocator's peak of
allocated bytes, on CPU the resident-memory high-water mark (VmHWM, reset at every switch), also given above the
memory at the start of the step. Tensor memory: the peak of tensors created since the step started and still
alive, i.e. what a step needs without allocator effects; on CUDA that is the allocated peak above the step's
start, on CPU it comes from one step run under ``LiveTensorTracker`` (``track_tensors``), since the CPU
allocator keeps no statistics.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from anemo_like.diagnostics.live_tensors import LiveTensorTracker
from anemo_like.runtime.process_memory import current_rss_mib, peak_memory_mib, reset_peak_rss

COMPONENTS = ("encoder", "processor", "decoder")
STEP_PHASES = (
    "data loading",
    "host to device",
    "encoder forward",
    "processor forward",
    "decoder forward",
    "loss",
    "decoder backward",
    "processor backward",
    "encoder backward",
    "optimizer step",
)


@dataclass
class PhaseTotals:
    """One phase summed over the recorded steps: seconds, CPU seconds, peak memory (MiB), and entries."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_mib: float = 0.0
    peak_above_step_start_mib: float = 0.0
    tensor_peak_mib: float = 0.0
    retained_mib: float = 0.0  # tensors created in the phase and still alive when it ends (forward: saved activations)
    entries: int = 0


@dataclass
class PhaseClock:
    """Attributes time and peak memory to named phases; ``recording`` off makes ``switch`` a cheap no-op."""

    device: torch.device
    recording: bool = False
    totals: dict[str, PhaseTotals] = field(default_factory=dict)
    steps: int = 0
    _current: str | None = None
    _wall: float = 0.0
    _cpu: float = 0.0
    _step_start_mib: float = 0.0
    _tracker: LiveTensorTracker | None = None
    _live_at_open: float = 0.0

    def _memory_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2**20
        return current_rss_mib() or 0.0

    def _peak_mib(self) -> float:
        return peak_memory_mib(self.device) or 0.0

    def _reset_peak(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            reset_peak_rss()

    def start_step(self, phase: str) -> None:
        """Begin a step in ``phase``: its memory at this point is the step's reference."""
        if not self.recording:
            return
        if self._tracker is None:
            self._step_start_mib = self._memory_mib()
            self.steps += 1
        self.switch(phase)

    def track_tensors(self, tracker: LiveTensorTracker | None) -> None:
        """While ``tracker`` is set (and active), switches record only each phase's tensor peak from it."""
        self._tracker = tracker

    def switch(self, phase: str | None) -> None:
        """Close the current phase and open ``phase`` (None: close only)."""
        if not self.recording:
            return
        if self._tracker is not None:
            live = self._tracker.live_bytes / 2**20
            if self._current is not None:
                totals = self.totals.setdefault(self._current, PhaseTotals())
                totals.tensor_peak_mib = max(totals.tensor_peak_mib, self._tracker.peak_bytes / 2**20)
                totals.retained_mib = max(totals.retained_mib, live - self._live_at_open)
            self._current, self._live_at_open = phase, live
            self._tracker.peak_bytes = self._tracker.live_bytes
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        wall, cpu = time.perf_counter(), time.process_time()
        if self._current is not None:
            totals = self.totals.setdefault(self._current, PhaseTotals())
            peak = self._peak_mib()
            totals.wall_s += wall - self._wall
            totals.cpu_s += cpu - self._cpu
            totals.peak_mib = max(totals.peak_mib, peak)
            totals.peak_above_step_start_mib = max(totals.peak_above_step_start_mib, peak - self._step_start_mib)
            if self.device.type == "cuda":
                totals.tensor_peak_mib = totals.peak_above_step_start_mib
                totals.retained_mib = max(totals.retained_mib, self._memory_mib() - self._live_at_open)
            totals.entries += 1
        self._current = phase
        if self.device.type == "cuda":
            self._live_at_open = self._memory_mib()
        if phase is not None:
            self._reset_peak()
            self._wall, self._cpu = time.perf_counter(), time.process_time()

    @property
    def current(self) -> str | None:
        return self._current

    def per_step(self) -> dict[str, PhaseTotals]:
        """Mean seconds per step and the largest peak of each phase, in ``STEP_PHASES`` order first."""
        steps = max(1, self.steps)
        names = [p for p in STEP_PHASES if p in self.totals] + [p for p in self.totals if p not in STEP_PHASES]
        return {
            name: PhaseTotals(
                wall_s=self.totals[name].wall_s / steps,
                cpu_s=self.totals[name].cpu_s / steps,
                peak_mib=self.totals[name].peak_mib,
                peak_above_step_start_mib=self.totals[name].peak_above_step_start_mib,
                tensor_peak_mib=self.totals[name].tensor_peak_mib,
                retained_mib=self.totals[name].retained_mib,
                entries=self.totals[name].entries,
            )
            for name in names
        }


def instrument_components(model: nn.Module, clock: PhaseClock, components: Iterable[str] = COMPONENTS) -> list:
    """Hook ``model.<component>`` for each component: forward switches to "<component> forward" on entry; when
    gradients are on, the gradient of its output switches to "<component> backward". The decoder's exit switches
    to "loss". Returns the hook handles (``handle.remove()`` to undo)."""
    handles = []
    for name in components:
        module = getattr(model, name)

        def enter(_module, _inputs, name=name) -> None:
            clock.switch(f"{name} forward")

        def leave(_module, _inputs, output, name=name):
            if name == "decoder":
                clock.switch("loss")
            if clock.recording and torch.is_grad_enabled() and output.requires_grad:
                output.register_hook(lambda grad, name=name: clock.switch(f"{name} backward"))
            return output

        handles.append(module.register_forward_pre_hook(enter))
        handles.append(module.register_forward_hook(leave))
    return handles

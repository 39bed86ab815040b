"""Record the CUDA caching allocator's history over a window of training steps.

On CUDA this writes ``memory_snapshot.pickle`` (drop it on https://pytorch.org/memory_viz). The recording API
does not exist for CPU tensors, so on CPU the recorder says why and samples the process's resident memory
instead, written as ``memory_timeline.csv``.
"""

from __future__ import annotations

import csv
import logging
from pathlib import Path

import torch

from anemo_like.diagnostics.sampler import MemorySample, MemorySampler

LOG = logging.getLogger(__name__)

SNAPSHOT_FILE = "memory_snapshot.pickle"
TIMELINE_FILE = "memory_timeline.csv"


def cuda_history_unavailable(device: torch.device) -> str | None:
    """Why the CUDA allocator history cannot be recorded on ``device``, or None when it can."""
    if device.type != "cuda":
        return f"torch.cuda.memory._record_memory_history records CUDA allocations only, and this run is on {device}"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


def write_timeline_csv(samples: list[MemorySample], path: Path) -> None:
    """Memory samples as CSV: seconds, MiB, phase."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["seconds", "memory_mib", "phase"])
        for s in samples:
            writer.writerow([f"{s.seconds:.4f}", f"{s.mib:.2f}", s.phase or ""])


class MemorySnapshotRecorder:
    """Starts recording before step ``warmup`` and writes the result after ``warmup + steps`` steps.

    Call ``step_started(index)`` with the number of steps this run has done so far, before each step, and
    ``close()`` at the end (writes what was recorded if the run stopped inside the window).
    """

    def __init__(self, *, device: torch.device, output_dir: Path, warmup: int, steps: int, max_entries: int) -> None:
        self.device = device
        self.output_dir = output_dir
        self.first, self.stop_at = warmup, warmup + steps
        self.max_entries = max_entries
        self.fallback_reason = cuda_history_unavailable(device)
        self.written: Path | None = None
        self._sampler: MemorySampler | None = None
        self._recording = False

    def step_started(self, index: int) -> None:
        if index == self.first and not self._recording:
            self._start()
        elif index == self.stop_at and self._recording:
            self._finish()

    def close(self) -> None:
        if self._recording:
            self._finish()

    def _start(self) -> None:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._recording = True
        if self.fallback_reason is None:
            try:
                torch.cuda.memory._record_memory_history(max_entries=self.max_entries)
                LOG.info("memory snapshot: recording CUDA allocator history for %d steps", self.stop_at - self.first)
                return
            except (RuntimeError, AttributeError) as exc:
                self.fallback_reason = f"torch.cuda.memory._record_memory_history failed: {exc}"
        LOG.warning(
            "memory snapshot: no CUDA allocator history (%s); sampling resident memory instead into %s",
            self.fallback_reason,
            self.output_dir / TIMELINE_FILE,
        )
        self._sampler = MemorySampler(self.device).__enter__()

    def _finish(self) -> None:
        self._recording = False
        if self._sampler is None:
            path = self.output_dir / SNAPSHOT_FILE
            torch.cuda.memory._dump_snapshot(str(path))
            torch.cuda.memory._record_memory_history(enabled=None)
        else:
            self._sampler.__exit__(None, None, None)
            path = self.output_dir / TIMELINE_FILE
            write_timeline_csv(self._sampler.samples, path)
            self._sampler = None
        self.written = path
        LOG.info("memory snapshot written: %s", path)

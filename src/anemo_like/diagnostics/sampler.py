"""A background thread that samples process memory every few milliseconds, labelled with the current phase."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from anemo_like.runtime.process_memory import resident_bytes


@dataclass
class MemorySample:
    seconds: float  # since the sampler started
    mib: float  # resident memory (CPU) or allocated memory (CUDA)
    phase: str | None


@dataclass
class MemorySampler:
    """``with MemorySampler(device, phase_of=clock_phase) as s: ...`` then ``s.samples``.

    On CPU it reads the resident set size (VmRSS); on CUDA ``torch.cuda.memory_allocated``. ``phase_of`` names
    the phase running at each sample (e.g. ``lambda: clock.current``).
    """

    device: torch.device
    phase_of: Callable[[], str | None] = lambda: None
    interval_s: float = 0.005
    samples: list[MemorySample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def source(self) -> str:
        return "torch.cuda.memory_allocated" if self.device.type == "cuda" else "resident memory (VmRSS)"

    def _read_mib(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.memory_allocated(self.device) / 2**20
        return (resident_bytes() or 0) / 2**20

    def _run(self, start: float) -> None:
        while not self._stop.is_set():
            self.samples.append(MemorySample(time.perf_counter() - start, self._read_mib(), self.phase_of()))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> MemorySampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(time.perf_counter(),), daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

"""Stop cleanly when the scheduler asks: SIGTERM (``scancel``, the end of a time limit) or SIGUSR1 (SLURM's
``--signal=USR1@<seconds>`` warning before the limit). The current step finishes, a checkpoint is written, and
the process exits with status 0, so ``training.resume: auto`` (with ``sbatch --requeue``) carries on."""

from __future__ import annotations

import signal
import threading
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written: exits the program with status 0."""

    def __init__(self) -> None:
        super().__init__(0)


class PreemptionSignal:
    """``with PreemptionSignal() as stop: ... if stop.received: ...``; handlers are installed for the block only
    (and only in the main thread, where Python delivers signals)."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[signal.Signals, object] = {}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.received = signal.Signals(signum).name

    def __enter__(self) -> PreemptionSignal:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

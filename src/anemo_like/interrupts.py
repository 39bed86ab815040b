"""SIGTERM, SIGINT (Ctrl-C) and SIGUSR1 in every phase of a command.

A command runs inside :func:`handling_signals`: a signal then raises :class:`Interrupted` at the next Python line,
once (later signals are noted, not raised again, so a second Ctrl-C cannot cut the clean-up short). Two kinds of
block change that:

- :func:`stop_requests` (the training loop): signals are only noted; the loop reads ``received`` after each step,
  writes a checkpoint and exits 0.
- :func:`deferred` (an atomic file write): signals are noted and raised when the block ends, so the write is
  finished, never half done.

The command catches :class:`Interrupted`, prints one line and exits with :attr:`Interrupted.exit_code`: 0 when
the work is saved (``saved`` says where), else 128 + the signal number (130 for SIGINT, 143 for SIGTERM). A loop
that stops by itself calls :func:`acting_on_stop` first, logs its line and raises a ``SystemExit`` the command
exits with. Either way the handlers stay installed until the process exits: a second signal during the shutdown
is noted, never raised or left to the default action, so the exit status is the one the last line gives.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Interrupted(BaseException):
    """A stop signal arrived. A BaseException, so ``except Exception`` clean-up code does not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signal = signal.Signals(signum)
        self.phase: str | None = None  # what was running (set by the innermost :func:`phase`)
        self.saved: str | None = None  # what is safely on disk, when the work can be continued from it
        super().__init__(self.signal.name)

    @property
    def exit_code(self) -> int:
        return 0 if self.saved else 128 + int(self.signal)

    def report(self) -> str:
        """One line for the log."""
        during = f" during {self.phase}" if self.phase else ""
        if self.saved:
            return f"received {self.signal.name}{during}: {self.saved}; exiting with status 0"
        stopped = "stopped before the work was saved"
        return f"received {self.signal.name}{during}: {stopped}; exiting with status {self.exit_code}"


@dataclass
class _State:
    installed: bool = False
    pid: int = 0  # the process that installed the handlers (forked loader workers leave signals to it)
    noting: int = 0  # depth of stop_requests / deferred blocks: note signals instead of raising
    raised: bool = False
    received: list[signal.Signals] = field(default_factory=list)
    previous: dict[signal.Signals, Any] = field(default_factory=dict)  # the handlers before ours


_state = _State()


def _handle(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _state.pid:  # a forked child (a loader worker): behave as before our handlers
        _as_before(signal.Signals(signum), frame)
        return
    _state.received.append(signal.Signals(signum))
    if _state.noting == 0 and not _state.raised:
        _state.raised = True
        raise Interrupted(signum)


def _as_before(sig: signal.Signals, frame: FrameType | None) -> None:
    previous = _state.previous.get(sig, signal.SIG_DFL)
    if callable(previous):
        previous(int(sig), frame)
    elif previous != signal.SIG_IGN:  # the default action: terminate
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)


@contextlib.contextmanager
def handling_signals() -> Iterator[None]:
    """Install the handlers for the block (main thread only; nested use is a no-op)."""
    if _state.installed or threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.previous = {s: signal.signal(s, _handle) for s in SIGNALS}
    _state.installed, _state.pid, _state.raised, _state.received = True, os.getpid(), False, []
    try:
        yield
    finally:
        for s, handler in _state.previous.items():
            signal.signal(s, handler)
        _state.installed = False


class StopRequests:
    """What :func:`stop_requests` yields: ``received`` is the first signal's name since the block began."""

    def __init__(self, start: int) -> None:
        self._start = start

    @property
    def received(self) -> str | None:
        new = _state.received[self._start :]
        return new[0].name if new else None


@contextlib.contextmanager
def stop_requests() -> Iterator[StopRequests]:
    """Note signals instead of raising them, for a loop that stops cleanly by itself (installs the handlers if
    no command did, e.g. when the trainer is used from Python). A signal the block did not act on is raised when
    it ends."""
    with handling_signals():
        with _noting():
            requests = StopRequests(len(_state.received))
            yield requests
        if requests.received is not None and not _state.raised:  # the block ended before it could stop
            _state.raised = True
            raise Interrupted(signal.Signals[requests.received])


def acting_on_stop() -> None:
    """A stop is under way (the training loop writes its checkpoint and exits): later signals are only noted."""
    _state.raised = True


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Finish the block before a signal takes effect: one that arrives inside is raised when the block ends."""
    start = len(_state.received)
    with _noting():
        yield
    if _state.installed and _state.noting == 0 and len(_state.received) > start and not _state.raised:
        _state.raised = True
        raise Interrupted(_state.received[start])


@contextlib.contextmanager
def _noting() -> Iterator[None]:
    _state.noting += 1
    try:
        yield
    finally:
        _state.noting -= 1


@contextlib.contextmanager
def phase(name: str, *, saved: Callable[[], str | None] | None = None) -> Iterator[None]:
    """Name what runs in the block for an :class:`Interrupted` raised in it; ``saved()`` says then what is safely
    saved, if the work can be continued from it."""
    try:
        yield
    except Interrupted as stop:
        if stop.phase is None:  # the innermost phase names it
            stop.phase, stop.saved = name, saved() if saved else None
        raise

"""The package's one progress display: a tqdm bar on a terminal, plain log lines otherwise (SLURM logs).

On a terminal (stderr is a tty) the bar shows steps done/total, it/s, ETA and the fields of the last update (loss,
rollout, ...); console log records are written above it while it is open. Otherwise a plain line goes to this
module's logger every ``log_every`` units if the caller gives it (training: with the loss it reads), else at most
every ``log_seconds`` seconds; always for the last unit and at close; never a carriage return. Disabled, it prints
nothing but still counts (:meth:`Progress.rate` works).

    with Progress(total=len(dates), desc="forecast", unit="step", enabled=show) as progress:
        for date in dates:
            ...
            progress.update(loss=loss)
"""

from __future__ import annotations

import logging
import sys
import time
from contextlib import ExitStack
from types import TracebackType

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

LOG = logging.getLogger(__name__)

Field = float | int | str


class Progress:
    """Progress of ``total`` units from ``initial`` (a resumed run starts past 0); see the module docstring.

    ``leave=False`` removes the bar when closed (a bar inside another). Plain lines come when the position passes a
    multiple of ``log_every`` if given, else ``log_seconds`` after the last line; and at ``total`` and at close.
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str = "",
        unit: str = "it",
        initial: int = 0,
        enabled: bool = True,
        leave: bool = True,
        log_every: int | None = None,
        log_seconds: float = 10.0,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.initial = self.position = self._logged_position = initial
        self.log_every, self.log_seconds = log_every, log_seconds
        self.started = self._logged_at = time.perf_counter()
        self._closed = False
        self._fields: dict[str, str] = {}  # the last update's fields, formatted
        self._exit = ExitStack()
        self._bar: tqdm | None = None
        self._plain = enabled and not sys.stderr.isatty()
        if enabled and not self._plain:
            if _console_logging():
                self._exit.enter_context(logging_redirect_tqdm())
            self._bar = tqdm(
                total=total, initial=initial, desc=desc, unit=unit, leave=leave, dynamic_ncols=True, file=sys.stderr
            )

    def rate(self) -> float:
        """Units per second since this object was created (from ``initial``)."""
        elapsed = time.perf_counter() - self.started
        return (self.position - self.initial) / elapsed if elapsed > 0 else 0.0

    def update(self, n: int = 1, **fields: Field) -> None:
        """``n`` more units done; ``fields`` (e.g. ``loss=0.12``) are shown beside the count until new ones come."""
        self.update_to(self.position + n, **fields)

    def update_to(self, position: int, **fields: Field) -> None:
        """``position`` units done in all; ``fields`` as in :meth:`update`."""
        done, self.position = position - self.position, position
        if fields:
            self._fields = {k: _format(v) for k, v in fields.items()}
        if self._bar is not None:
            if fields:
                self._bar.set_postfix(self._fields, refresh=False)
            self._bar.update(done)
        elif self._plain and self._line_due():
            self._log()

    def close(self) -> None:
        """End the display (a last plain line if the last update was not logged); safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._plain and self.position != self._logged_position:
            self._log()
        self._exit.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def _line_due(self) -> bool:
        if self.position >= self.total:
            return True
        if self.log_every is not None:
            return self.position // self.log_every > self._logged_position // self.log_every
        return time.perf_counter() - self._logged_at >= self.log_seconds

    def _log(self) -> None:
        elapsed = time.perf_counter() - self.started
        rate = self.rate()
        eta = tqdm.format_interval((self.total - self.position) / rate) if rate > 0 else "?"
        extras = "".join(f", {k} {v}" for k, v in self._fields.items())
        percent = f" ({100 * self.position / self.total:.0f}%)" if self.total else ""
        LOG.info(
            "%s%s/%d %s%s, %.2f %s/s, elapsed %s, ETA %s%s",
            f"{self.desc}: " if self.desc else "",
            self.position,
            self.total,
            self.unit,
            percent,
            rate,
            self.unit,
            tqdm.format_interval(elapsed),
            eta,
            extras,
        )
        self._logged_position, self._logged_at = self.position, time.perf_counter()


def _format(value: Field) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _console_logging() -> bool:
    """Whether the root logger writes to the terminal (then its records are written above the bar)."""
    return any(
        isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr) for h in logging.root.handlers
    )

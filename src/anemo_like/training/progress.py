"""A dependency-free progress line with it/s and ETA (redrawn in place on a terminal, logged otherwise)."""

from __future__ import annotations

import logging
import sys
import time

LOG = logging.getLogger(__name__)


class Progress:
    def __init__(self, *, total: int, start: int = 0, enabled: bool = True) -> None:
        self.total = total
        self.start_step = start
        self.enabled = enabled
        self.started = time.perf_counter()
        self.interactive = sys.stderr.isatty()

    def rate(self, step: int) -> float:
        """Steps per second since this object was created."""
        elapsed = time.perf_counter() - self.started
        return (step - self.start_step) / elapsed if elapsed > 0 else 0.0

    def update(self, step: int, **fields: float) -> None:
        if not self.enabled:
            return
        rate = self.rate(step)
        eta = (self.total - step) / rate if rate > 0 else float("nan")
        extras = " ".join(f"{k} {v:.4g}" for k, v in fields.items())
        line = f"step {step}/{self.total} {rate:.2f} it/s ETA {eta:5.0f}s {extras}"
        if self.interactive:
            sys.stderr.write("\r" + line.ljust(100))
            sys.stderr.flush()
        else:
            LOG.info(line)

    def close(self) -> None:
        if self.enabled and self.interactive:
            sys.stderr.write("\n")

"""``anemo-train`` whose logs take SECONDS to flush and close at exit (a slow file system), so a test can signal it
after its last line, while it shuts down. MARKER is created when that closing begins.

python tests/slow_log_close.py SECONDS MARKER key=value ...
"""

from __future__ import annotations

import atexit
import logging
import sys
import time
from pathlib import Path

from anemo_like.cli.train import main

_shutdown = logging.shutdown


def closing_slowly(handlers: list | None = None, *, seconds: float, marker: Path) -> None:
    """``logging.shutdown``; at exit (no ``handlers``: logging.config passes them when it replaces the handlers at
    set-up) it first creates ``marker`` and waits ``seconds``."""
    if handlers is not None:
        _shutdown(handlers)
        return
    marker.touch()
    time.sleep(seconds)
    _shutdown()


if __name__ == "__main__":
    pause, closing = float(sys.argv.pop(1)), Path(sys.argv.pop(1))

    def slow(handlers: list | None = None) -> None:
        closing_slowly(handlers, seconds=pause, marker=closing)

    logging.shutdown = slow
    atexit.register(slow)  # an interpreter exit: atexit holds the original logging.shutdown, not this module's name
    main()

"""How the argparse commands (anemo-import, anemo-sync) end on a refusal: one line on stderr, then the status."""

from __future__ import annotations

import sys
from typing import NoReturn


def fail(program: str, message: str, code: int) -> NoReturn:
    """Print ``program: message`` on stderr and exit with ``code`` (2: the input, 1: anything else)."""
    print(f"{program}: {message}", file=sys.stderr, flush=True)
    sys.exit(code)

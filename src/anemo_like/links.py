"""A symbolic link that leads nowhere, in words: for messages about a path the user gave (a checkpoint, a dataset),
which would otherwise say the path does not exist, or fail resolving a loop."""

from __future__ import annotations

import errno
import os
from pathlib import Path


def broken_link(path: Path) -> str | None:
    """``'is a symbolic link that leads back to itself (a loop)'`` or ``'is a symbolic link to TARGET, which does
    not exist'`` when ``path`` is a link that leads to nothing; None otherwise."""
    if not path.is_symlink():
        return None
    try:
        path.stat()
    except OSError as error:
        if error.errno == errno.ELOOP:
            return "is a symbolic link that leads back to itself (a loop)"
        return f"is a symbolic link to {os.readlink(path)}, which does not exist"
    return None

"""Crash-safe file writes: a reader sees the old file or the complete new one, never a partial write."""

from __future__ import annotations

import io
import os
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import torch

PAUSE_FOR_TESTS = "ANEMO_LIKE_TEST_PAUSE_IN_SAVE_S"
"""Test hook: seconds to pause halfway through writing the temporary file, so a test can kill the process
mid-save. Unset in normal use."""


def _write_pausing_halfway(obj: Any, f: IO[bytes], seconds: float) -> None:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    data = buffer.getvalue()
    f.write(data[: len(data) // 2])
    f.flush()
    time.sleep(seconds)
    f.write(data[len(data) // 2 :])


def atomic_torch_save(obj: Any, path: Path) -> None:
    """torch.save to ``path`` via a temporary sibling file, fsync and rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    pause = os.environ.get(PAUSE_FOR_TESTS)
    try:
        with os.fdopen(fd, "wb") as f:
            if pause:
                _write_pausing_halfway(obj, f, float(pause))
            else:
                torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the platform allows opening a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Crash-safe file writes: a reader sees the old file or the complete new one, never a partial write. A stop
signal during a write takes effect once the write is done (:func:`~anemo_like.interrupts.deferred`); a full disk
raises :class:`DiskFull` naming the file, and leaves no temporary file."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from anemo_like.interrupts import deferred

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OSError):
    """No space left (or the quota is spent) where a file was being written."""


def disk_full(error: OSError, path: Path, *, setting: str) -> OSError:
    """``error`` as :class:`DiskFull` naming ``path`` and the setting that chose it, when it is a full disk."""
    if error.errno not in NO_SPACE:
        return error
    full = DiskFull(
        f"no space left on the device holding {path} ({os.strerror(error.errno)}): free space there or choose "
        f"another folder ({setting}=...); nothing was written"
    )
    full.errno = error.errno
    return full


def atomic_torch_save(obj: Any, path: Path, *, setting: str = "system.paths.output") -> None:
    """torch.save to ``path`` via a temporary sibling file, fsync and rename. ``setting`` is the option that
    chose the folder, named when the disk is full."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with deferred():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        writer = None
        try:
            with os.fdopen(fd, "wb") as f:
                writer = _Writer(f)
                torch.save(obj, writer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except (OSError, RuntimeError) as error:  # torch reports a failed write as a RuntimeError
            Path(tmp).unlink(missing_ok=True)
            failed = error if isinstance(error, OSError) else writer.error if writer else None
            if failed is None:
                raise
            raise disk_full(failed, path, setting=setting) from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_directory(path.parent)


class _Writer:
    """A file for torch.save that keeps the OSError of a failed write (torch turns it into a RuntimeError)."""

    def __init__(self, file: Any) -> None:
        self.file, self.error = file, None

    def write(self, data: bytes) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = error
            raise

    def flush(self) -> None:
        self.file.flush()


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

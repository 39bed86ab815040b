"""A run folder belongs to one run. A new run refuses a folder that holds another run's checkpoints, metrics or
inference checkpoint (``training.resume=auto`` continues that run instead), and temporary files a killed process
left behind are removed when a run starts in the folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path

LOG = logging.getLogger(__name__)

RUN_FILES = ("checkpoints/last.pt", "checkpoints/step-*.pt", "metrics.jsonl", "inference.pt")
STALE = ("checkpoints/.*.tmp", "checkpoints/.last.pt.link", ".*.tmp")  # atomic writes cut short by a kill


def create_run_folder(run_dir: Path) -> None:
    """``mkdir -p`` with a one-line error naming the folder."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        writable = os.access(run_dir, os.W_OK | os.X_OK)
    except OSError as error:
        raise ValueError(
            f"system.paths.output {run_dir} cannot be created ({error.strerror}); choose a folder you can write "
            "(system.paths.output=...)"
        ) from None
    if not writable:
        raise ValueError(
            f"system.paths.output {run_dir} is not writable; choose a folder you can write (system.paths.output=...)"
        )


def check_run_folder_is_free(run_dir: Path, *, resume: str | None) -> None:
    """Refuse to start a new run in ``run_dir`` when it holds another run's files. Continuing is allowed:
    ``resume='auto'``, or a checkpoint inside the folder."""
    found = sorted({str(p.relative_to(run_dir)) for pattern in RUN_FILES for p in run_dir.glob(pattern)})
    if not found:
        return
    if resume == "auto" or (resume is not None and _inside(Path(resume).expanduser(), run_dir)):
        return
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    raise ValueError(
        f"system.paths.output {run_dir} already holds a run ({shown}): set training.resume=auto to continue it, "
        "or choose another folder (system.paths.output=...)"
    )


def remove_stale_temporary_files(run_dir: Path) -> list[Path]:
    """Delete the temporary files of writes cut short by a killed process; returns them."""
    stale = sorted({p for pattern in STALE for p in run_dir.glob(pattern) if p.is_file()})
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        LOG.info("removed %d temporary file(s) left by a killed run: %s", len(stale), ", ".join(map(str, stale)))
    return stale


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())

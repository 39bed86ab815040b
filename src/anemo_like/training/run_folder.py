"""A run folder belongs to one run. A new run refuses a folder that holds another run's checkpoints, metrics or
inference checkpoint (``training.resume=auto`` continues that run instead), and temporary files a killed process
left behind are removed when a run starts in the folder.

The commands claim the folder with :func:`claim_run_folder`: an OS lock (``flock``) on ``<folder>/.run.lock``,
taken before the check, so runs started at the same moment cannot both pass it. The lock lasts as long as the
process (the OS drops it when the process dies, SIGKILL included), so a killed run leaves no stale claim.
"""

from __future__ import annotations

import fcntl
import logging
import os
import socket
from pathlib import Path

from anemo_like.checkpoints.locate import CHECKPOINTS_FOLDER, listed, training_checkpoints_in

LOG = logging.getLogger(__name__)
LOCK_FILE = ".run.lock"
_held: set[int] = set()  # this process's lock descriptors: a forked child closes its copies (the lock stays ours)


def _close_in_child() -> None:
    """A forked child (a loader worker) drops its copies, so the lock ends with the process that claimed it."""
    for descriptor in _held:
        os.close(descriptor)
    _held.clear()


os.register_at_fork(after_in_child=_close_in_child)

METRICS = "metrics.jsonl"
RUN_FILES = ("checkpoints/last.pt", "checkpoints/step-*.pt", METRICS, "inference.pt")
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
    ``resume='auto'``, or a checkpoint inside the folder. A run's checkpoints folder is refused as a run folder."""
    held = training_checkpoints_in(run_dir)
    if held and run_dir.name == CHECKPOINTS_FOLDER:
        raise ValueError(
            f"system.paths.output {run_dir} is the checkpoints folder of a run (it holds {held[0].name}), not a run "
            f"folder: set system.paths.output={run_dir.parent} (with training.resume=auto to continue that run), or "
            "choose another folder"
        )
    found = sorted(
        str(p.relative_to(run_dir))
        for pattern in RUN_FILES
        for p in run_dir.glob(pattern)
        if p.stat().st_size or p.name != METRICS  # an empty metrics file: a run that failed before its first record
    )
    if not found:
        return
    if resume == "auto" or (resume is not None and _inside(Path(resume).expanduser(), run_dir)):
        return
    raise ValueError(
        f"system.paths.output {run_dir} already holds a run ({listed(found, 4)}): set training.resume=auto to "
        "continue it, or choose another folder (system.paths.output=...)"
    )


class RunFolderClaim:
    """A process's claim of a run folder: the lock on ``.run.lock``, held until :meth:`release` or the process
    ends. ``descriptor`` None: a claim held by another rank (rank 0 locks the folder for every rank)."""

    def __init__(self, *, run_dir: Path, descriptor: int | None) -> None:
        self.run_dir = run_dir
        self._descriptor = descriptor

    def release(self) -> None:
        if self._descriptor is not None:
            _held.discard(self._descriptor)
            os.close(self._descriptor)  # the last descriptor of the lock file: the lock goes with it
            self._descriptor = None

    def __enter__(self) -> RunFolderClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def claim_run_folder(run_dir: Path, *, resume: str | None) -> RunFolderClaim:
    """Create ``run_dir``, lock it for this process, check it holds no other run and remove stale temporary files;
    one step for any number of processes starting in the folder at once. A folder holding a run is refused before
    the lock file is created, so a refused run changes nothing in it."""
    create_run_folder(run_dir)
    _check_not_running(run_dir)  # a run still writing its files here is named as such, not as a finished one
    check_run_folder_is_free(run_dir, resume=resume)
    descriptor = _lock(run_dir)
    try:
        check_run_folder_is_free(run_dir, resume=resume)  # again: a run may have ended here since the first check
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"process {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        remove_stale_temporary_files(run_dir)
    except BaseException:
        _held.discard(descriptor)
        os.close(descriptor)
        raise
    return RunFolderClaim(run_dir=run_dir, descriptor=descriptor)


def _check_not_running(run_dir: Path) -> None:
    """Refuse ``run_dir`` while another process holds its lock (a run still running), without creating the lock
    file when there is none."""
    try:
        descriptor = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file: no run was ever claimed here
        return
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _in_use(run_dir, descriptor) from None
    except OSError:  # a file system without locks: _lock says so
        pass
    finally:
        os.close(descriptor)


def _in_use(run_dir: Path, descriptor: int) -> ValueError:
    """The refusal of a folder whose lock (open at ``descriptor``) another process holds, naming it."""
    holder = os.pread(descriptor, 200, 0).decode(errors="replace").strip() or "a process starting"
    return ValueError(
        f"system.paths.output {run_dir} is in use by a run still running ({holder}): wait for it to end, or choose "
        "another folder (system.paths.output=...)"
    )


def _lock(run_dir: Path) -> int:
    """The descriptor of ``run_dir/.run.lock``, locked for this process; a one-line error when another holds it."""
    try:
        descriptor = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as error:
        raise _cannot_lock(run_dir, error) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        error = _in_use(run_dir, descriptor)
        os.close(descriptor)
        raise error from None
    except OSError as error:  # a file system without locks
        os.close(descriptor)
        raise _cannot_lock(run_dir, error) from None
    _held.add(descriptor)
    return descriptor


def _cannot_lock(run_dir: Path, error: OSError) -> ValueError:
    return ValueError(
        f"system.paths.output {run_dir} cannot be locked ({error.strerror}): {LOCK_FILE} must be a file you can "
        "write, on a file system with file locks; choose another folder (system.paths.output=...)"
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

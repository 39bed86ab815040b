"""A checkpoint path as given in a config (``training.resume``, ``training.init_from``, anemo-infer's
``checkpoint``): the file to read, or one message saying what the path is instead (a run folder, a checkpoints
folder, a symbolic link that leads nowhere) and which file to pass."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from anemo_like.links import broken_link

INFERENCE_FILE = "inference.pt"  # of a run folder
CHECKPOINTS_FOLDER = "checkpoints"  # of a run folder, holding its training checkpoints:
LATEST = "last.pt"  # the latest, and
STEP_FILES = "step-*.pt"  # one per step saved (step_checkpoint_name)
Format = Literal["inference", "training"]
NAMES: dict[Format, tuple[str, ...]] = {"inference": (INFERENCE_FILE,), "training": (LATEST, STEP_FILES)}


def training_checkpoints_in(folder: Path) -> list[Path]:
    """The training checkpoints directly in ``folder``: ``last.pt`` first, then the step files, newest first."""
    latest = folder / LATEST
    steps = sorted((p for p in folder.glob(STEP_FILES) if p.is_file()), reverse=True)
    return [latest, *steps] if latest.is_file() else steps


def listed(names: list[str], most: int) -> str:
    """``names`` joined by commas, the first ``most`` of them and how many more ("a, b and 3 more")."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def checkpoint_file(path: Path, *, key: str, formats: tuple[Format, ...], missing: str) -> Path:
    """``path`` when it is a file; else raise: a folder or a broken symbolic link (ValueError naming ``key``, what
    the path is and the file of ``formats`` to pass), nothing at all (FileNotFoundError with ``missing``)."""
    if path.is_file():
        return path
    if path.is_dir():
        raise ValueError(_folder_message(path, key=key, formats=formats))
    broken = broken_link(path)
    if broken is not None:
        raise ValueError(f"{key}: {path} {broken}; point it at a checkpoint file, or pass the file itself")
    raise FileNotFoundError(missing)


def _run_of(folder: Path) -> tuple[str, Path | None, list[Path]]:
    """What ``folder`` is, the anemo-train run folder it is or lies in (None: none), and its training checkpoints."""
    if (folder / CHECKPOINTS_FOLDER).is_dir() or (folder / INFERENCE_FILE).is_file():
        return "the run folder of an anemo-train run", folder, training_checkpoints_in(folder / CHECKPOINTS_FOLDER)
    held = training_checkpoints_in(folder)
    if held and folder.name == CHECKPOINTS_FOLDER:
        return "the checkpoints folder of an anemo-train run", folder.parent, held
    return "a folder of training checkpoints", None, held


def _folder_message(folder: Path, *, key: str, formats: tuple[Format, ...]) -> str:
    kind, run, training = _run_of(folder)
    inference = run / INFERENCE_FILE if run is not None else None
    files = [
        *([inference] if "inference" in formats and inference is not None and inference.is_file() else []),
        *(training if "training" in formats else []),
    ]
    if not files:
        *names, last = [name for f in formats for name in NAMES[f]]
        wanted = f"{', '.join(names)} or {last}" if names else last
        unfinished = ""
        if run is not None and formats == ("inference",):
            unfinished = (
                f": its run has not finished (training.resume=auto with system.paths.output={run} finishes it and "
                f"writes {inference})"
            )
        return (
            f"{key}: {folder} is a folder, not a checkpoint file, and holds no {wanted}{unfinished}; pass a "
            f"checkpoint file ({key}=FILE)"
        )
    first, others = files[0], [str(p.relative_to(files[0].parent)) for p in files[1:]]
    also = f" (also there: {', '.join(others)})" if others else ""
    auto = f", or training.resume=auto with system.paths.output={run}" if key == "training.resume" and run else ""
    example = f"{key}={first}{also}{auto}"
    return f"{key}: {folder} is a folder ({kind}), not a checkpoint file; pass a checkpoint file, e.g. {example}"

"""Where ``anemo-import`` writes: a ``.pt`` file, or ``inference.pt`` in a folder; checked before anything is read,
so a refusal costs no reading and leaves nothing behind."""

from __future__ import annotations

import tempfile
from pathlib import Path

from anemo_like.anemoi_import.archive import ImportRefused


def output_file(output: Path) -> Path:
    """``output`` itself when it names a ``.pt`` file (or any existing file), else ``output/inference.pt``.

    Refused: a target that exists, a new name with another suffix than ``.pt`` (``model.pth``: a typo is not made a
    folder), and a folder that cannot be written."""
    if output.suffix == ".pt" or (output.exists() and not output.is_dir()):
        target = output
    elif output.suffix and not output.exists():
        raise ImportRefused(
            f"output {output}: a new file must end in .pt, the format anemo-infer reads; give NAME.pt, or a folder "
            "(an existing one or a name without a suffix) to write inference.pt into (nothing was written)"
        )
    else:
        target = output / "inference.pt"
    if target.exists():
        raise ImportRefused(
            f"{target} already exists: give another output, or move it away first (nothing was written)"
        )
    _check_writable(target)
    return target


def _check_writable(target: Path) -> None:
    """Refuse ``target`` when the nearest existing folder above it is a file or refuses a new file."""
    nearest = next(folder for folder in target.parents if folder.exists())
    if not nearest.is_dir():
        raise ImportRefused(
            f"output {target}: {nearest} is a file, not a folder; choose a path in a folder (nothing was written)"
        )
    try:
        with tempfile.TemporaryFile(dir=nearest):
            pass
    except OSError as error:
        raise ImportRefused(
            f"output {target}: cannot write into {nearest} ({error.strerror or error}); choose a folder you can write "
            "(nothing was written)"
        ) from None

"""Where anemo-import writes: an existing output left untouched, a name that is neither ``.pt`` nor a folder and a
folder that cannot be written refused before anything is read, one line each; and the CLI exits 2 on them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from inference_helpers import documented

from anemo_like.anemoi_import.archive import ImportRefused
from anemo_like.anemoi_import.convert import import_checkpoint

SOURCE = Path(__file__).resolve().parent / "data" / "anemoi" / "default" / "inference-last.ckpt"


# ------------------------------------------------------------------------------------------------ output exists
@pytest.mark.parametrize("given", ["file", "folder"])
def test_existing_output_is_refused_and_untouched(given, tmp_path) -> None:
    """OUTPUT a .pt file that exists, or a folder already holding inference.pt."""
    existing = tmp_path / "model.pt" if given == "file" else tmp_path / "models" / "inference.pt"
    existing.parent.mkdir(exist_ok=True)
    existing.write_bytes(b"an earlier import")
    os.utime(existing, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    stat = existing.stat()
    output = existing if given == "file" else existing.parent
    before = sorted(existing.parent.iterdir())
    with pytest.raises(ImportRefused) as info:
        import_checkpoint(SOURCE, output)
    message = str(info.value)
    assert "\n" not in message and str(existing) in message
    assert existing.read_bytes() == b"an earlier import"
    assert existing.stat().st_mtime_ns == stat.st_mtime_ns and existing.stat().st_size == stat.st_size
    assert sorted(existing.parent.iterdir()) == before
    documented(message, OUT=existing)


def test_existing_output_file_not_named_pt_is_refused_up_front(tmp_path) -> None:
    existing = tmp_path / "model.pth"
    existing.write_bytes(b"an earlier import")
    with pytest.raises(ImportRefused) as info:
        import_checkpoint(SOURCE, existing)
    assert existing.read_bytes() == b"an earlier import"
    documented(str(info.value), OUT=existing)


def _refusal(output: Path) -> str:
    """The one-line refusal of importing SOURCE into ``output``; nothing is added beside it."""
    folder = next(p for p in output.parents if p.exists())
    before = sorted(folder.iterdir()) if folder.is_dir() and os.access(folder, os.R_OK) else None
    with pytest.raises(ImportRefused) as info:
        import_checkpoint(SOURCE, output)
    message = str(info.value)
    assert "\n" not in message and str(output) in message
    assert before is None or sorted(folder.iterdir()) == before
    return message


def test_a_new_name_with_another_suffix_is_refused_not_made_a_folder(tmp_path) -> None:
    output = tmp_path / "model.pth"
    message = _refusal(output)
    assert not output.exists()
    documented(message, OUT=output)


def test_a_path_below_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("not a folder")
    output = tmp_path / "notes.txt" / "imported"
    message = _refusal(output)
    assert (tmp_path / "notes.txt").read_text() == "not a folder"
    documented(message, OUT=output / "inference.pt", FILE=tmp_path / "notes.txt")


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc, where nobody can create a file")
def test_a_folder_that_cannot_be_written_is_refused_up_front(tmp_path) -> None:
    output = Path("/proc/imported/model.pt")
    message = _refusal(output)
    assert message.startswith("output /proc/imported/model.pt: cannot write into /proc (")
    reason = message[message.index("(") : message.index(")") + 1]
    documented(message.replace(reason, "(REASON)").replace("/proc ", "FOLDER "), OUT=output)


def test_the_cli_exits_2_before_reading_the_checkpoint(tmp_path) -> None:
    output = tmp_path / "model.ckpt"
    result = subprocess.run(
        [sys.executable, "-m", "anemo_like.cli.import_anemoi", str(SOURCE), str(output)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr  # not a step was taken
    assert result.stderr.startswith(f"anemo-import: output {output}: ") and result.stderr.count("\n") == 1
    assert sorted(tmp_path.iterdir()) == []

"""The wheel ships the Hydra config tree, so anemo-train works from any directory after a normal install."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_contains_config_tree_and_entry_point(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("anemo_like-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        "anemo_like/_config/" + str(p.relative_to(ROOT / "training" / "config"))
        for p in (ROOT / "training" / "config").rglob("*.yaml")
    }
    assert expected and expected <= names, sorted(expected - names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "anemo-train = anemo_like.cli.train:main" in zipfile.ZipFile(wheel).read(entry_points).decode()

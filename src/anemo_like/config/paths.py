"""Where the packaged Hydra config tree lives."""

from __future__ import annotations

from pathlib import Path


def config_dir() -> Path:
    """The config tree: ``anemo_like/_config`` in an installed wheel, ``training/config`` in a source checkout."""
    packaged = Path(__file__).resolve().parents[1] / "_config"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "training" / "config"

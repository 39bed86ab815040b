"""The documentation: the generated configuration reference matches the schema, and the site builds without a
warning (broken links, pages missing from the nav)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_is_up_to_date():
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_config_reference.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="mkdocs is in the test extras: pip install -e '.[test]'")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr

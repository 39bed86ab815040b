"""The GPU proof kit's runner (``gpu_check.py``): its time budget, the commands it runs under it with the kit's
Python and path, and the wheels it installs first."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import REPO


class Budget:
    """The kit's wall-clock budget: each section gets at most its own cap and what is left overall."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def timeout(self, cap: float) -> float:
        return max(0.0, min(cap, self.left()))


class BudgetSpent(Exception):
    """A command could not start, or was stopped, because the kit's time budget ran out (not a failure)."""

    def __init__(self, what: str, output: str = "") -> None:
        super().__init__(what)
        self.output = output


class Kit:
    """Runs the sections' commands with the kit's Python and path, under the budget."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], budget: Budget) -> None:
        self.args, self.env, self.budget = args, env, budget
        self.device, self.quick = args.device, args.quick
        self.python = sys.executable

    def run(self, command: list[str], cap: float, *, env: dict[str, str] | None = None, cwd: Path | None = None):
        """Run ``command`` for at most ``cap`` seconds; returns (exit status, None after ``cap``; stdout, stderr).
        Raises ``BudgetSpent`` when the budget leaves under 5 s to start it, or ran out while it ran."""
        timeout = self.budget.timeout(cap)
        if timeout < 5:
            raise BudgetSpent("not started: the time budget is spent")
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, env=env or self.env, cwd=cwd or REPO
            )
        except subprocess.TimeoutExpired as exc:
            out, err = (
                s.decode(errors="replace") if isinstance(s, bytes) else s or "" for s in (exc.stdout, exc.stderr)
            )
            if timeout < cap:
                raise BudgetSpent(f"stopped after {timeout:.0f} s: the time budget ran out", out + err) from None
            return None, out, err + f"\n[timed out after {timeout:.0f} s]"
        return done.returncode, done.stdout, done.stderr


def install_wheels(wheels: Path, target: Path) -> str:
    """Install every wheel of ``wheels`` (not its subfolders) into ``target`` with pip, offline; where this Python
    has no pip, unpack them (a wheel is a zip of its importable files). Returns what was done, in one line."""
    files = sorted(wheels.glob("*.whl"))
    if not files:
        return f"no wheels in {wheels}"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
    done = subprocess.run(
        [*pip, "--upgrade", "--target", str(target), *map(str, files)], capture_output=True, text=True
    )
    if done.returncode == 0:
        return f"pip installed {len(files)} wheels into {target}"
    for wheel in files:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return f"unpacked {len(files)} wheels into {target} (pip failed: {done.stderr.strip()[-200:]})"


def kit_environment(site: Path | None) -> dict[str, str]:
    """This process's environment with ``site`` (installed wheels) and ``src`` first on PYTHONPATH."""
    paths = [str(p) for p in (site, REPO / "src") if p is not None]
    rest = os.environ.get("PYTHONPATH", "")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, *([rest] if rest else [])])}

"""What the benchmark scripts share: where the repository, ``../shared``, each script and this Python's commands
are; running a command and reading the JSON line it prints, and printing one; a logged run's wall and CPU seconds;
a measured record kept for ``--reuse``; this process's CPU seconds and memory figures; a free TCP port.

Standard library only: the anchor's venv imports it too. A script in a folder of ``benchmarks/`` makes it
importable with ``sys.path.insert(0, str(Path(__file__).resolve().parents[2]))`` (the repository root)."""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
SHARED = REPO.parent / "shared"
ANCHOR_RUN = SHARED / "bench" / "anchor" / "run.py"  # ECMWF anemoi-models at given sizes (../shared/bench/anchor)
ANCHOR_PYTHON = Path("/tmp/anchor/venv/bin/python")  # the anchor's venv: bash ../shared/bench/anchor/setup.sh
STDERR_TAIL = 3000  # characters of a failed command's stderr shown in its error


def script(name: str) -> Path:
    """The benchmark script ``name`` (e.g. ``"step_time.py"``), in whichever folder of ``benchmarks/`` holds it."""
    found = sorted(BENCHMARKS.glob(f"*/{name}"))
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} benchmark scripts named {name} under {BENCHMARKS}; expected one")
    return found[0]


def console_script(name: str) -> str:
    """This Python's command ``name`` (``anemo-train``, ``anemo-infer``, ...), found with or without the venv
    activated."""
    return str(Path(sys.executable).with_name(name))


def last_json(text: str) -> dict:
    """The last line of ``text`` that parses as a JSON object; ``ValueError`` when none does."""
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON line in the output")


def command_text(command: Sequence[str | Path]) -> str:
    return " ".join(map(str, command))


def run_checked(
    command: Sequence[str | Path], *, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """Run ``command`` with its output captured; a failure stops the calling script with the command and the tail
    of its stderr."""
    done = subprocess.run(list(map(str, command)), capture_output=True, text=True, env=env, cwd=cwd, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{command_text(command)} failed (exit {done.returncode}):\n{done.stderr[-STDERR_TAIL:]}")
    return done


def run_json(command: Sequence[str | Path], *, env: Mapping[str, str] | None = None, cwd: Path | None = None) -> dict:
    """Run ``command`` (``run_checked``); the last JSON line it printed, or the calling script stops saying so."""
    done = run_checked(command, env=env, cwd=cwd)
    try:
        return last_json(done.stdout)
    except ValueError:
        raise SystemExit(f"{command_text(command)} printed no JSON line:\n{done.stdout[-STDERR_TAIL:]}") from None


def print_json(record: dict, out: str | Path | None = None) -> dict:
    """Print ``record`` as the script's JSON line; with ``out`` (not None or empty), also append it to that file."""
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        with Path(out).open("a") as f:
            f.write(line + "\n")
    return record


def run_logged(command: Sequence[str | Path], log: Path, *, env: Mapping[str, str] | None = None) -> dict:
    """Run ``command`` with its output in ``log``; its wall seconds and the CPU seconds of it and the children it
    waited for (loader workers, spawned ranks). A failure stops the calling script, naming ``log``."""
    started = time.perf_counter()
    with log.open("w") as out:
        process = subprocess.Popen(list(map(str, command)), env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command_text(command)} failed: see {log}")
    return {"wall_s": round(time.perf_counter() - started, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1)}


def recorded(record: Path, reuse: bool, measure: Callable[[], dict]) -> dict:
    """``measure()``, kept as JSON in ``record``; with ``reuse``, an existing ``record`` is read instead."""
    if reuse and record.is_file():
        return json.loads(record.read_text())
    measured = measure()
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(measured))
    return measured


def cpu_s() -> float:
    """CPU seconds (user + system) of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def status_mib(key: str = "VmHWM") -> float:
    """A memory figure of this process from /proc/self/status (VmHWM: the resident high-water mark; VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def free_port() -> int:
    """A TCP port free on this machine now (for a process group or a server the script starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

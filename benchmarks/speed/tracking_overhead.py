#!/usr/bin/env python3
"""Wall time of ``anemo-train`` with experiment tracking on against off. Prints ONE JSON line.

Quickstart runs of ``--steps`` steps (validation only at the end, no progress bar), in pairs whose order swaps
every pair: one with ``diagnostics.tracking.backend=none``, one with ``mlflow`` sending to the default local store
(``sqlite:///<folder>/mlflow.db``) or, with ``--server``, to an MLflow server this script starts on 127.0.0.1. A
first tracked run, not timed, generates the built-in dataset and creates the MLflow database. The figure is the
median over the pairs of (wall seconds on) / (wall seconds off) - 1; the target is at most 0.03. Run it alone::

    python benchmarks/speed/tracking_overhead.py                 # about 8 minutes on a 2-core machine
    python benchmarks/speed/tracking_overhead.py --server --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import free_port, run_checked


def train(folder: Path, name: str, steps: int, tracking: list[str]) -> float:
    """Wall seconds of one ``anemo-train`` process."""
    run_dir = folder / name
    command = [sys.executable, "-m", "anemo_like.cli.train", "--config-name=quickstart", f"training.max_steps={steps}",
               f"training.val_every_n_steps={steps}", f"training.checkpoint_every_n_steps={steps}",
               "diagnostics.progress_bar=false", f"system.paths.output={run_dir}", f"hydra.run.dir={run_dir}",
               f"system.paths.cache={folder / 'cache'}", *tracking]  # fmt: skip
    started = time.perf_counter()
    run_checked(command, cwd=folder)
    return time.perf_counter() - started


def start_server(folder: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
               f"sqlite:///{folder / 'server.db'}", "--artifacts-destination", str(folder / "server-artifacts"),
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2):
                return process, uri
        except OSError:
            time.sleep(0.3)
    raise SystemExit("the MLflow server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--server", action="store_true", help="track to a local MLflow server, not the sqlite file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tracking-overhead-") as tmp:
        folder = Path(tmp)
        server, uri = start_server(folder) if args.server else (None, None)
        tracking = ["diagnostics.tracking.backend=mlflow", "diagnostics.tracking.experiment_name=overhead"]
        tracking += [f"diagnostics.tracking.tracking_uri={uri}"] if uri else []
        try:
            train(folder, "warm-up", args.steps, tracking)
            off, on = [], []
            for pair in range(args.pairs):
                order = [("off", []), ("on", tracking)][:: 1 if pair % 2 == 0 else -1]
                for label, overrides in order:
                    seconds = train(folder, f"{label}-{pair}", args.steps, overrides)
                    (on if label == "on" else off).append(round(seconds, 2))
        finally:
            if server is not None:
                os.killpg(server.pid, signal.SIGKILL)
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    overhead = statistics.median(ratios) - 1
    record = {"benchmark": "tracking_overhead", "steps": args.steps, "pairs": args.pairs,
              "store": "server" if args.server else "sqlite", "wall_s_off": off, "wall_s_on": on,
              "median_wall_s_off": statistics.median(off), "median_wall_s_on": statistics.median(on),
              "overhead": round(overhead, 4), "target": 0.03, "met": overhead <= 0.03}  # fmt: skip
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()

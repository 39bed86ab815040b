#!/usr/bin/env python3
"""Loader and training throughput on a real dataset with ``anemo-bench``, one setting per process.

Runs the config's default loader settings in all three modes (io, synthetic, full), then io for
``dataloader.num_workers`` 0/1/2 with and without ``pin_memory``, then full for each ``--precisions`` entry and
for one loader worker reading 1 or 2 batches ahead.
Settings are interleaved over ``--repeats`` rounds and each figure is the median. Prints one JSON line:

    python benchmarks/speed/throughput.py --dataset ../shared/data/hs-t21-seed1-1y.zarr

Other ``key=value`` arguments are passed to every run as Hydra overrides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import SHARED, run_json

DEFAULT_DATASET = SHARED / "data" / "hs-t21-seed1-1y.zarr"


def bench(overrides: list[str], run_dir: Path) -> dict:
    """One ``anemo-bench`` process; its JSON line."""
    command = [sys.executable, "-m", "anemo_like.cli.bench", *overrides, f"hydra.run.dir={run_dir}"]
    return run_json(command)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default=str(DEFAULT_DATASET), help="a zarr path, or builtin")
    parser.add_argument("--config-name", default="hs_t21")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, default=20, help="timed batches per mode")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--precisions", nargs="+", default=["32", "bf16-mixed"])
    args, extra = parser.parse_known_args()
    if args.dataset != "builtin" and not Path(args.dataset).exists():
        raise SystemExit(f"--dataset {args.dataset}: no such dataset")
    common = [
        f"--config-name={args.config_name}",
        f"data.dataset={args.dataset}",
        f"diagnostics.bench.batches={args.batches}",
        "training.val_climatology_dates=0",
        "diagnostics.progress_bar=false",
        *extra,
    ]
    settings: dict[str, list[str]] = {"default": []}
    for workers in args.workers:
        for pin in ("true", "false"):
            options = [f"dataloader.num_workers.train={workers}", f"dataloader.pin_memory={pin}"]
            settings[f"io workers={workers} pin_memory={pin}"] = [*options, "diagnostics.bench.modes=[io]"]
    for precision in args.precisions:
        settings[f"full precision={precision}"] = [f"training.precision={precision}", "diagnostics.bench.modes=[full]"]
    for workers, prefetch in ((1, 1), (1, 2)):  # does a worker (and how far it reads ahead) pay off here?
        settings[f"full workers={workers} prefetch_factor={prefetch}"] = [
            f"dataloader.num_workers.train={workers}",
            f"dataloader.prefetch_factor={prefetch}",
            "diagnostics.bench.modes=[full]",
        ]
    runs: dict[str, list[dict]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.repeats):
            for i, (name, overrides) in enumerate(settings.items()):
                runs[name].append(bench([*common, *overrides], Path(scratch) / f"{round_}-{i}"))

    def median(name: str, mode: str) -> float:
        return round(statistics.median(r[f"{mode}_samples_per_s"] for r in runs[name]), 2)

    default = {mode: median("default", mode) for mode in ("io", "synthetic", "full")}
    record = {
        "dataset": args.dataset,
        "config": args.config_name,
        "repeats": args.repeats,
        "batches": args.batches,
        "default_samples_per_s": default,
        "default_io_over_full": round(default["io"] / default["full"], 1),
        "default_bounds": [r["bound"] for r in runs["default"]],  # each run's own verdict
        "default_advice": runs["default"][-1]["advice"],
        "io_samples_per_s": {n.removeprefix("io "): median(n, "io") for n in settings if n.startswith("io ")},
        "full_samples_per_s": {n.removeprefix("full "): median(n, "full") for n in settings if n.startswith("full ")},
        "cores": runs["default"][-1]["cores"],
        "device": runs["default"][-1]["device"],
    }
    print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()

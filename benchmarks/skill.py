"""Forecast skill at a fixed CPU budget: train from scratch, score, compare with anemoi-training; ONE JSON line.

    python benchmarks/skill.py --dataset ../shared/data/hs-t21-seed1-1y.zarr [--runs 2] [--val-dataset OTHER.zarr]
        [--config hs_t21_cpu] [--output DIR] [-- key=value ...]

Each run is the documented command, ``anemo-train --config-name=CONFIG data.dataset=DATASET``, in a fresh process
with an empty graph cache (so the wall time includes the graph build) and its own output folder. The score is the
run's final validation (``data.splits.val``, ``training.val_rollout`` steps; ``--val-dataset`` validates on another
trajectory of the same grid instead). Printed: wall seconds and the 6 h / 24 h RMSE of each run, the ratio of the
first run to the anemoi-training reference (issue 11: 6 h <= 1, 24 h <= 0.85), and with ``--runs 2`` the largest
relative difference between the runs (same config and seed; reproducible means <= 2 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# anemoi-training 0.17.1 on this machine (issue 11): graph transformer, 128 channels, 6 layers, 1650 steps, 34 min,
# scored over 40 start dates of another Held-Suarez trajectory; area-weighted RMSE, physical units.
REFERENCE_RMSE = {
    "z_500": {"6h": 30.6, "1d": 178.7},
    "t_850": {"6h": 0.199, "1d": 1.064},
    "u_250": {"6h": 1.03, "1d": 4.76},
    "v_500": {"6h": 0.870, "1d": 3.93},
    "sp": {"6h": 30.2, "1d": 168.7},
}
TARGET_RATIO = {"6h": 1.0, "1d": 0.85}
WALL_LIMIT_S = 34 * 60


def final_scores(metrics: Path) -> dict[str, float]:
    """The last validation record of a run's metrics.jsonl: ``rmse_<variable>_<lead>`` -> RMSE."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    scored = [r for r in records if "val_loss" in r]
    if not scored:
        raise SystemExit(f"{metrics} holds no validation record: the run did not finish")
    return {k: v for k, v in scored[-1].items() if k.startswith("rmse_")} | {"step": scored[-1]["step"]}


def anemo_train_command(config: str, dataset: str | Path, run_dir: Path, overrides: list[str]) -> list[str]:
    """The documented ``anemo-train --config-name=CONFIG data.dataset=DATASET`` writing into ``run_dir``."""
    return [
        str(Path(sys.executable).with_name("anemo-train")),
        f"--config-name={config}",
        f"data.dataset={dataset}",
        f"system.paths.output={run_dir}",
        f"hydra.run.dir={run_dir}",
        "diagnostics.progress_bar=false",
        *overrides,
    ]


def train_once(args: argparse.Namespace, run_dir: Path) -> dict:
    """One documented training run from scratch; its wall and CPU seconds (all processes) and final scores."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    command = anemo_train_command(
        args.config,
        args.dataset,
        run_dir,
        [*([f"data.val_dataset={args.val_dataset}"] if args.val_dataset else []), *args.overrides],
    )
    env = os.environ | {"ANEMO_LIKE_CACHE": str(run_dir / "cache")}  # empty cache: the graph is built and timed
    started, cpu_started = time.perf_counter(), os.times()
    with (run_dir / "stdout.log").open("w") as log:
        subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    wall, finished = time.perf_counter() - started, os.times()
    cpu = finished.children_user + finished.children_system - cpu_started.children_user - cpu_started.children_system
    scores = final_scores(run_dir / "metrics.jsonl")
    return {
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu),
        "steps": scores.pop("step"),
        "rmse": {k.removeprefix("rmse_"): v for k, v in scores.items()},
    }


REFERENCED = [f"{var}_{lead}" for var, leads in REFERENCE_RMSE.items() for lead in leads]


def compare(rmse: dict[str, float]) -> dict[str, float]:
    """RMSE / reference for each referenced variable and lead that the run scored."""
    return {
        f"{var}_{lead}": round(rmse[f"{var}_{lead}"] / ref, 3)
        for var, leads in REFERENCE_RMSE.items()
        for lead, ref in leads.items()
        if f"{var}_{lead}" in rmse
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="training dataset (anemoi-datasets zarr)")
    parser.add_argument("--val-dataset", help="validate on this zarr instead (another trajectory, same grid)")
    parser.add_argument("--config", default="hs_t21_cpu")
    parser.add_argument("--runs", type=int, default=1, help="2 checks reproducibility")
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides after --")
    args = parser.parse_args()
    root = args.output or Path(tempfile.mkdtemp(prefix="anemo-skill-"))
    runs = [train_once(args, root / f"run{i}") for i in range(args.runs)]
    ratios = compare(runs[0]["rmse"])
    result = {
        "benchmark": "skill",
        "config": args.config,
        "dataset": str(args.dataset),
        "val_dataset": args.val_dataset,
        "overrides": args.overrides,
        "runs": [run | {"rmse": {k: round(v, 4) for k, v in run["rmse"].items() if k in REFERENCED}} for run in runs],
        "ratio_to_anemoi": ratios,
        "missing": [key for key in REFERENCED if key not in ratios],
        "meets_skill_target": len(ratios) == len(REFERENCED)
        and all(r <= TARGET_RATIO[key.rsplit("_", 1)[1]] for key, r in ratios.items()),
        "meets_wall_limit": all(run["wall_s"] <= WALL_LIMIT_S for run in runs),
    }
    if len(runs) > 1:
        result["max_relative_spread"] = round(
            max(
                abs(run["rmse"][k] - runs[0]["rmse"][k]) / runs[0]["rmse"][k]
                for run in runs[1:]
                for k in runs[0]["rmse"]
            ),
            5,
        )
    if args.output is None:
        shutil.rmtree(root)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

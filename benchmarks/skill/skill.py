"""Forecast skill at a fixed CPU budget: train from scratch, score, compare with anemoi-training; ONE JSON line.

    python benchmarks/skill/skill.py --dataset ../shared/data/hs-t21-seed1-1y.zarr [--runs 2] [--val-dataset OTHER.zarr]
        [--config hs_t21_cpu] [--pretrain CONFIG [--pretrain-set key=value ...]] [--baseline FILE] [--output DIR]
        [-- key=value ...]

Each run is the documented command, ``anemo-train --config-name=CONFIG data.dataset=DATASET``, in a fresh process
with an empty graph cache (so the time includes the graph build) and its own output folder. With ``--pretrain``
a run is the two-stage recipe: CONFIG (with the ``--pretrain-set`` overrides) first, then ``--config`` with
``training.init_from`` its ``inference.pt``; both stages count. The score is the final validation
(``data.splits.val``, ``training.val_rollout`` steps; ``--val-dataset`` validates on another trajectory of the same
grid instead). Printed: wall and CPU seconds (the kernel's accounting of every process) and the 6 h / 24 h RMSE of
each run; the first run's ratios to the anemoi-training reference and to ``hs_t21_cpu`` as documented; issue 41's
targets (24 h <= 0.70 x anemoi on every variable, 6 h no worse than ``hs_t21_cpu``, within 4,040 CPU-s; and time
to skill: ``hs_t21_cpu``'s 24 h RMSE in at most half its CPU seconds, documented or, with ``--baseline``, measured
beside this run; the CPU limit then scales with it); with ``--runs 2`` the largest relative
difference between the runs (same config and seed; reproducible means <= 2 %).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import console_script, run_logged

# anemoi-training 0.17.1 on this machine (issue 11): graph transformer, 128 channels, 6 layers, 1650 steps, 34 min,
# scored over 40 start dates of another Held-Suarez trajectory; area-weighted RMSE, physical units.
REFERENCE_RMSE = {
    "z_500": {"6h": 30.6, "1d": 178.7},
    "t_850": {"6h": 0.199, "1d": 1.064},
    "u_250": {"6h": 1.03, "1d": 4.76},
    "v_500": {"6h": 0.870, "1d": 3.93},
    "sp": {"6h": 30.2, "1d": 168.7},
}
# hs_t21_cpu as docs/skill.md gives it (issue 11): area-weighted RMSE on the held-out months; 3,083 CPU-s at 2 threads
# (its stage in docs/ensembles.md, which reproduced these scores to the digit). --baseline replaces the CPU seconds
# by a run measured beside this one: the machine's speed drifts by tens of percent from day to day.
BASELINE_CPU_S = 3083
BASELINE_RMSE = {
    "z_500": {"6h": 26.13, "1d": 111.8},
    "t_850": {"6h": 0.1877, "1d": 0.841},
    "u_250": {"6h": 0.713, "1d": 2.726},
    "v_500": {"6h": 0.6375, "1d": 2.388},
    "sp": {"6h": 26.23, "1d": 114.2},
}
TARGET_RATIO_1D = 0.70  # issue 41: 24 h RMSE <= 0.7 x anemoi-training's; 6 h <= hs_t21_cpu's
CPU_LIMIT_S = 4040  # 34 minutes of 2 cores, at the speed that gave BASELINE_CPU_S
TIME_TO_SKILL_SHARE = 0.5  # issue 41: hs_t21_cpu's 24 h RMSE in at most half its CPU seconds


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
        console_script("anemo-train"),
        f"--config-name={config}",
        f"data.dataset={dataset}",
        f"system.paths.output={run_dir}",
        f"hydra.run.dir={run_dir}",
        "diagnostics.progress_bar=false",
        *overrides,
    ]


def train_stage(config: str, dataset: str | Path, run_dir: Path, cache: Path, overrides: list[str]) -> dict:
    """One ``anemo-train`` process into ``run_dir`` with the graph cache ``cache``; its wall and CPU seconds (the
    process and the children it waited for, e.g. loader workers)."""
    run_dir.mkdir(parents=True)
    command = anemo_train_command(config, dataset, run_dir, overrides)
    env = os.environ | {"ANEMO_LIKE_CACHE": str(cache)}
    return run_logged(command, run_dir / "stdout.log", env=env)


def train_once(args: argparse.Namespace, run_dir: Path) -> dict:
    """One documented training run from scratch (both stages with ``--pretrain``, sharing an empty graph cache);
    wall and CPU seconds of all its processes, and the final scores."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    validation = [f"data.val_dataset={args.val_dataset}"] if args.val_dataset else []
    cache, stages, final_dir, overrides = run_dir / "cache", [], run_dir, [*validation, *args.overrides]
    if args.pretrain:
        pretrain = [*validation, *args.pretrain_set]
        stages.append(train_stage(args.pretrain, args.dataset, run_dir / "pretrain", cache, pretrain))
        final_dir = run_dir / "finetune"
        overrides = [f"training.init_from={run_dir / 'pretrain' / 'inference.pt'}", *overrides]
    stages.append(train_stage(args.config, args.dataset, final_dir, cache, overrides))
    scores = final_scores(final_dir / "metrics.jsonl")
    return {
        "wall_s": round(sum(stage["wall_s"] for stage in stages), 1),
        "cpu_s": round(sum(stage["cpu_s"] for stage in stages)),
        "steps": scores.pop("step"),
        "rmse": {k.removeprefix("rmse_"): v for k, v in scores.items()},
    }


REFERENCED = [f"{var}_{lead}" for var, leads in REFERENCE_RMSE.items() for lead in leads]


def ratios_to(reference: dict[str, dict[str, float]], rmse: dict[str, float]) -> dict[str, float]:
    """RMSE / reference for each referenced variable and lead that the run scored."""
    return {
        f"{var}_{lead}": round(rmse[f"{var}_{lead}"] / ref, 3)
        for var, leads in reference.items()
        for lead, ref in leads.items()
        if f"{var}_{lead}" in rmse
    }


def baseline_cpu(path: Path | None) -> float:
    """hs_t21_cpu's CPU seconds: the first run of ``path`` (a JSON line of this script with ``--config
    hs_t21_cpu``, measured beside the runs compared with it), else the documented ``BASELINE_CPU_S``."""
    if path is None:
        return BASELINE_CPU_S
    measured = json.loads(path.read_text())
    if measured.get("config") != "hs_t21_cpu" or measured.get("pretrain") or measured.get("val_dataset"):
        raise SystemExit(f"--baseline {path}: expected this script's line for --config hs_t21_cpu, got {measured}")
    return measured["runs"][0]["cpu_s"]


def targets(run: dict, base_cpu: float) -> dict[str, bool]:
    """Issue 41's targets for one run: skill within the CPU budget (scaled by ``base_cpu`` / BASELINE_CPU_S), and
    time to ``hs_t21_cpu``'s 24 h skill in at most half of ``base_cpu``."""
    to_anemoi, to_baseline = ratios_to(REFERENCE_RMSE, run["rmse"]), ratios_to(BASELINE_RMSE, run["rmse"])
    complete = len(to_anemoi) == len(REFERENCED)
    day = [key for key in REFERENCED if key.endswith("_1d")]
    return {
        "meets_skill_target": complete
        and all(to_anemoi[key] <= TARGET_RATIO_1D for key in day)
        and all(to_baseline[key] <= 1.0 for key in REFERENCED if key.endswith("_6h")),
        "meets_cpu_limit": run["cpu_s"] <= CPU_LIMIT_S * base_cpu / BASELINE_CPU_S,
        "meets_time_to_skill": complete
        and all(to_baseline[key] <= 1.0 for key in day)
        and run["cpu_s"] <= TIME_TO_SKILL_SHARE * base_cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="training dataset (anemoi-datasets zarr)")
    parser.add_argument("--val-dataset", help="validate on this zarr instead (another trajectory, same grid)")
    parser.add_argument("--config", default="hs_t21_cpu")
    parser.add_argument("--pretrain", help="two-stage recipe: train this config first, --config from its weights")
    parser.add_argument("--pretrain-set", action="append", default=[], help="a key=value of the pretraining")
    parser.add_argument("--runs", type=int, default=1, help="2 checks reproducibility")
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--baseline", type=Path, help="this script's JSON line of hs_t21_cpu, run beside this one")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of --config after --")
    args = parser.parse_args()
    base_cpu = baseline_cpu(args.baseline)
    root = args.output or Path(tempfile.mkdtemp(prefix="anemo-skill-"))
    runs = [train_once(args, root / f"run{i}") for i in range(args.runs)]
    checks = [targets(run, base_cpu) for run in runs]
    result = {
        "benchmark": "skill",
        "config": args.config,
        "pretrain": [args.pretrain, *args.pretrain_set] if args.pretrain else None,
        "dataset": str(args.dataset),
        "val_dataset": args.val_dataset,
        "overrides": args.overrides,
        "runs": [run | {"rmse": {k: round(v, 4) for k, v in run["rmse"].items() if k in REFERENCED}} for run in runs],
        "ratio_to_anemoi": ratios_to(REFERENCE_RMSE, runs[0]["rmse"]),
        "ratio_to_hs_t21_cpu": ratios_to(BASELINE_RMSE, runs[0]["rmse"]),
        "hs_t21_cpu_cpu_s": base_cpu,
        "cpu_share_of_hs_t21_cpu": round(runs[0]["cpu_s"] / base_cpu, 3),
        "missing": [key for key in REFERENCED if key not in runs[0]["rmse"]],
        **{key: all(check[key] for check in checks) for key in checks[0]},
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

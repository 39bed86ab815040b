"""Pretrain then fine-tune against training from scratch, at equal CPU time, on the Held-Suarez data; ONE JSON line.

    python benchmarks/skill/finetune_skill.py --dataset ../shared/data/hs-t21-seed1-1y.zarr [--output DIR] [--threads 1]
        [--finetune-steps N] [--sequential] [--reuse] [--finetune-name finetune] [-- key=value ...]

Two pipelines run side by side (each process with ``--threads`` threads, so on 2 cores they do not slow each other
more than sharing the machine does): ``hs_t21_cpu`` from scratch, and ``hs_t21`` (rollout 1, constant learning
rate, 900 steps) followed by ``hs_t21_finetune`` from its ``inference.pt``: the commands in that config's header.
Each is the documented command in a fresh process; ``max_minutes`` is lifted so the step schedules decide.
Printed: each pipeline's CPU seconds (every process it ran, from the kernel's accounting of that process), its
final validation RMSE on ``data.splits.val`` (the held-out months, 4 steps of 6 h), and the fine-tuned /
from-scratch RMSE ratio per variable at 6 h and 24 h. The target: a 24 h ratio <= 1 for every scored variable at
no more CPU time. Overrides after ``--`` go to the fine-tuning run; with
``--reuse``, runs already finished in ``--output`` (their ``run.json``) are not run again, so fine-tuning variants
(``--finetune-name``) share one from-scratch run and one pretraining.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import recorded
from benchmarks.skill.skill import REFERENCE_RMSE, final_scores, train_stage

PRETRAIN = ["training.max_steps=900", "training.optimizer.lr_min=1e-3"]  # hs_t21_finetune.yaml's pretraining
SCORED = list(REFERENCE_RMSE)  # z_500, t_850, u_250, v_500, sp
LEADS = ("6h", "1d")


def run_command(config: str, run_dir: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    """``anemo-train --config-name=CONFIG`` into ``run_dir`` with ``--threads`` threads and no time limit; its wall
    and CPU seconds, also kept in ``run_dir/run.json`` for ``--reuse``."""
    threads = [f"system.hardware.num_threads={args.threads}", "training.max_minutes=null"]
    return recorded(
        run_dir / "run.json",
        args.reuse,
        lambda: train_stage(config, args.dataset, run_dir, run_dir / "cache", [*threads, *extra]),
    )


def scratch(args: argparse.Namespace, root: Path) -> dict:
    run = run_command("hs_t21_cpu", root / "scratch", args, [])
    return run | {"scores": final_scores(root / "scratch" / "metrics.jsonl")}


def finetune_overrides(args: argparse.Namespace) -> list[str]:
    steps = [f"training.max_steps={args.finetune_steps}"] if args.finetune_steps else []
    return [*steps, *args.overrides]


def pretrain_then_finetune(args: argparse.Namespace, root: Path) -> dict:
    pretrain = run_command("hs_t21", root / args.pretrain_name, args, args.pretrain_override or PRETRAIN)
    weights = root / args.pretrain_name / "inference.pt"
    finetune = run_command(
        "hs_t21_finetune",
        root / args.finetune_name,
        args,
        [f"training.init_from={weights}", *finetune_overrides(args)],
    )
    return {
        "wall_s": pretrain["wall_s"] + finetune["wall_s"],
        "cpu_s": pretrain["cpu_s"] + finetune["cpu_s"],
        "pretrain_cpu_s": round(pretrain["cpu_s"]),
        "scores": final_scores(root / args.finetune_name / "metrics.jsonl"),
    }


def run_pipelines(args: argparse.Namespace, root: Path) -> tuple[dict, dict]:
    """Both pipelines, side by side (or one after the other with ``--sequential``)."""
    results: dict[str, dict] = {}
    jobs = {"scratch": scratch, "finetuned": pretrain_then_finetune}

    def run(name: str) -> None:
        results[name] = jobs[name](args, root)

    if args.sequential:
        for name in jobs:
            run(name)
    else:
        threads = [threading.Thread(target=run, args=(name,)) for name in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if len(results) != 2:
            raise SystemExit(f"a pipeline failed (see the stdout.log files under {root})")
    return results["scratch"], results["finetuned"]


def summary(run: dict) -> dict:
    rmse = {f"{v}_{lead}": round(run["scores"][f"rmse_{v}_{lead}"], 4) for v in SCORED for lead in LEADS}
    extra = {k: v for k, v in run.items() if k not in ("scores", "wall_s", "cpu_s")}
    return {"wall_s": round(run["wall_s"]), "cpu_s": round(run["cpu_s"]), "steps": run["scores"]["step"], **extra,
            "rmse": rmse}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, help="the Held-Suarez dataset (anemoi-datasets zarr)")
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per training process")
    parser.add_argument("--finetune-steps", type=int, help="default: hs_t21_finetune's max_steps")
    parser.add_argument("--sequential", action="store_true", help="run the pipelines one after the other")
    parser.add_argument("--reuse", action="store_true", help="keep the runs already finished in --output")
    parser.add_argument("--finetune-name", default="finetune", help="the fine-tuning run's folder in --output")
    parser.add_argument("--pretrain-name", default="pretrain", help="the pretraining run's folder in --output")
    pretrain_help = f"key=value for the pretraining run (repeatable; default: {' '.join(PRETRAIN)})"
    parser.add_argument("--pretrain-override", action="append", default=[], help=pretrain_help)
    parser.add_argument("overrides", nargs="*", help="overrides of the fine-tuning run, after --")
    args = parser.parse_args()
    root = args.output or Path(tempfile.mkdtemp(prefix="anemo-finetune-"))
    scratch_run, finetuned_run = (summary(run) for run in run_pipelines(args, root))
    ratio = {key: round(finetuned_run["rmse"][key] / scratch_run["rmse"][key], 3) for key in scratch_run["rmse"]}
    print(json.dumps({
        "benchmark": "finetune_skill",
        "dataset": str(args.dataset),
        "threads": args.threads,
        "pretrain_overrides": args.pretrain_override or PRETRAIN,
        "finetune_overrides": finetune_overrides(args),
        "scratch": scratch_run,
        "pretrain_finetune": finetuned_run,
        "cpu_ratio": round(finetuned_run["cpu_s"] / scratch_run["cpu_s"], 3),
        "rmse_ratio": ratio,
        "meets_target": all(ratio[f"{v}_1d"] <= 1.0 for v in SCORED)
        and finetuned_run["cpu_s"] <= scratch_run["cpu_s"],
        "output": str(root),
    }))  # fmt: skip


if __name__ == "__main__":
    main()

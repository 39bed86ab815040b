"""Ensemble skill on the Held-Suarez data against the deterministic model it starts from; ONE JSON line.

    python benchmarks/skill/ensemble_skill.py --dataset ../shared/data/hs-t21-seed1-1y.zarr [--output DIR] [--threads 2]
        [--members 16] [--every 12h] [--deterministic hs_t21_day] [--ensemble hs_t21_ens_day] [--reuse]
        [-- key=value ...]

The pipeline is the documented one (``training/config/hs_t21_ens_day.yaml``'s header): ``--deterministic``, then
``--ensemble`` from its ``inference.pt`` (overrides after ``--`` go to this run), each a fresh process with
``--threads`` threads. Both models then forecast 120 h with ``anemo-infer verify=true`` from the same initial dates
of the held-out months (November and December, every ``--every``; the ensemble with ``--members`` members, seed
0), and the scores come from the two ``verification.json`` files. Printed: wall and CPU seconds of every stage
(CPU from the kernel's accounting of each process), and for z_500, t_850, u_250, v_500 and sp at 24 h, 72 h and
120 h: the deterministic RMSE and MAE, the ensemble's fair CRPS, ensemble-mean RMSE, spread and spread/skill, and
the targets of issue 41: spread/skill within [0.85, 1.15] at 24, 72 and 120 h, CRPS <= 0.65 x the deterministic
MAE at 24 h, ensemble-mean RMSE <= the deterministic RMSE at every 6-h lead, all within 90 minutes.
With ``--reuse``, stages already finished in ``--output`` (their ``run.json``) are not run again.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import console_script, recorded, run_logged
from benchmarks.skill.finetune_skill import run_command
from benchmarks.skill.skill import REFERENCE_RMSE

SCORED = list(REFERENCE_RMSE)  # z_500, t_850, u_250, v_500, sp
LEADS = ("1d", "3d", "5d")
FIRST_DATE, LAST_DATE = "2000-11-01T00", "2000-12-25T12"  # the held-out months; the last 120 h end in the data
WALL_LIMIT_S = 90 * 60


def verify(args: argparse.Namespace, checkpoint: Path, folder: Path, members: int) -> dict:
    """``anemo-infer verify=true`` of ``checkpoint``: 120 h from every ``--every`` of the held-out months; the
    verification.json scores, wall and CPU seconds."""
    command = [
        console_script("anemo-infer"),
        f"checkpoint={checkpoint}",
        f"dataset={args.dataset}",
        f"date_range.start={FIRST_DATE}",
        f"date_range.end={LAST_DATE}",
        f"date_range.every={args.every}",
        "lead_time=5d",
        f"output={folder / 'forecast.nc'}",
        f"hydra.run.dir={folder}",
        f"members={members}",
        "seed=0",
        "verify=true",
        f"num_threads={args.threads}",
        f"batch_size={args.batch_size}",
    ]

    def measure() -> dict:
        folder.mkdir(parents=True, exist_ok=True)
        measured = run_logged(command, folder / "stdout.log")
        return measured | {"scores": json.loads((folder / "verification.json").read_text())}

    return recorded(folder / "run.json", args.reuse, measure)


def score(stage: dict, variable: str, lead: str, key: str) -> float:
    """One score of a verification stage: its verification.json's ``scores[variable][lead][key]``."""
    return float(stage["scores"]["scores"][variable][lead][key])


def table(deterministic: dict, ensemble: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Per variable and lead: deterministic rmse and mae, ensemble crps, ens_rmse, spread and ssr."""
    rows: dict[str, dict[str, dict[str, float]]] = {}
    for variable in SCORED:
        rows[variable] = {}
        for lead in LEADS:
            row = {f"det_{key}": score(deterministic, variable, lead, key) for key in ("rmse", "mae")}
            row |= {key: score(ensemble, variable, lead, key) for key in ("crps", "ens_rmse", "spread", "ssr")}
            rows[variable][lead] = {key: round(value, 4) for key, value in row.items()}
    return rows


def mean_rmse_ratios(deterministic: dict, ensemble: dict) -> dict[str, float]:
    """Ensemble-mean RMSE / deterministic RMSE of each scored variable at its worst 6-h lead."""
    leads = deterministic["scores"]["leads"]
    return {
        v: round(max(score(ensemble, v, lead, "ens_rmse") / score(deterministic, v, lead, "rmse") for lead in leads), 4)
        for v in SCORED
    }


def targets(rows: dict[str, dict[str, dict[str, float]]], worst_mean: dict[str, float], wall_s: float) -> dict:
    """Issue 41's targets, each over every scored variable."""
    return {
        "spread_skill_0.85_to_1.15": all(0.85 <= rows[v][lead]["ssr"] <= 1.15 for v in SCORED for lead in LEADS),
        "crps_le_0.65_det_mae_24h": all(rows[v]["1d"]["crps"] <= 0.65 * rows[v]["1d"]["det_mae"] for v in SCORED),
        "ens_rmse_le_det_rmse_every_lead": all(ratio <= 1.0 for ratio in worst_mean.values()),
        "within_90_minutes": wall_s <= WALL_LIMIT_S,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", required=True, type=Path)
    parser.add_argument("--output", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of every process")
    parser.add_argument("--members", type=int, default=16, help="members of the verified ensemble forecasts")
    parser.add_argument("--every", default="12h", help="spacing of the verified initial dates")
    parser.add_argument("--batch-size", type=int, default=8, help="anemo-infer batch_size (dates x members)")
    parser.add_argument("--deterministic", default="hs_t21_day", help="config of the deterministic model")
    parser.add_argument("--ensemble", default="hs_t21_ens_day", help="config of the ensemble, from its weights")
    parser.add_argument("--reuse", action="store_true", help="keep stages already finished in --output")
    parser.add_argument("overrides", nargs="*", help="--ensemble overrides after --")
    args = parser.parse_args()
    args.dataset = args.dataset.resolve()
    root = (args.output or Path(tempfile.mkdtemp(prefix="anemo-ensemble-"))).resolve()
    stages = {"deterministic": run_command(args.deterministic, root / "deterministic", args, [])}
    weights = root / "deterministic" / "inference.pt"
    extra = [f"training.init_from={weights}", *args.overrides]
    stages["ensemble"] = run_command(args.ensemble, root / "ensemble", args, extra)
    stages["verify_deterministic"] = verify(args, weights, root / "verify-deterministic", members=1)
    stages["verify_ensemble"] = verify(args, root / "ensemble" / "inference.pt", root / "verify-ensemble", args.members)
    rows = table(stages["verify_deterministic"], stages["verify_ensemble"])
    worst_mean = mean_rmse_ratios(stages["verify_deterministic"], stages["verify_ensemble"])
    wall = sum(stage["wall_s"] for stage in stages.values())
    print(
        json.dumps(
            {
                "benchmark": "ensemble_skill",
                "dataset": str(args.dataset),
                "configs": [args.deterministic, args.ensemble],
                "threads": args.threads,
                "members_verified": args.members,
                "overrides": args.overrides,
                "stages": {name: {k: round(s[k]) for k in ("wall_s", "cpu_s")} for name, s in stages.items()},
                "wall_s": round(wall),
                "scores": rows,
                "worst_ens_rmse_over_det_rmse": worst_mean,
                "targets": targets(rows, worst_mean, wall),
            }
        )
    )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Side by side with the anchor (anemoi-models, ``../shared/bench/anchor/run.py``) at cases R, T and S.

For every round and case it runs the anchor, then ``benchmarks/speed/step_time.py`` with the same flags (the order
swaps every round), one process each, 1 torch thread. It prints a markdown table to stderr (medians over the
rounds of each run's median CPU seconds per step and of its step memory, and the ratios ours / anchor) and ONE
JSON line with the same figures to stdout. The targets of the speed issue are printed next to the ratios.

    bash ../shared/bench/anchor/setup.sh            # once: builds /tmp/anchor/venv
    python benchmarks/anchor/compare_anchor.py --rounds 3  # about 15 minutes on a 2-core machine
    python benchmarks/anchor/compare_anchor.py --cases S --rounds 5

Step memory is VmHWM during the steps minus RSS just before them for both (``peak_rss_steps_delta_mib``).

``--plan-budget-from-anchor`` tests the memory plan: each round runs the anchor first and gives ours its measured
step memory as ``--memory-budget-gb`` (num_chunks and gradient_checkpointing auto, AdamW on, live tensors
counted); the table then adds the plan, its predicted peak and the measured tensor peak (within 15 % expected,
CPU time ≤ 0.8 x the anchor's at R).

    python benchmarks/anchor/compare_anchor.py --cases R --rounds 3 --plan-budget-from-anchor
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import ANCHOR_PYTHON, ANCHOR_RUN, run_json, script
from benchmarks.speed.step_args import REFERENCE

CASES = {
    "R": [*REFERENCE, "--num-vars", "8", "--multistep", "2"],
    "T": [*REFERENCE, "--num-vars", "8", "--multistep", "2", "--processor", "transformer"],
    "S": ["--grid", "32x64", "--mesh-res", "3", "--channels", "128", "--layers", "4"],
}
TARGETS = {"R": (0.5, 0.5), "T": (0.5, 0.5), "S": (0.7, None)}
"""Per case: the largest CPU-time ratio and peak-memory ratio (None: no target)."""
COMMON = ["--threads", "1", "--warmup", "2", "--num-chunks-mapper", "4", "--num-chunks-processor", "4"]


def case_summary(case: str, anchor: list[dict], ours: list[dict]) -> dict:
    def median(runs: list[dict], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    figures = {
        "case": case,
        "flags": CASES[case] + COMMON,
        "rounds": len(ours),
        "params": {"anchor": anchor[0]["params"], "ours": ours[0]["params"]},
        "graph": {"anchor": anchor[0]["graph"], "ours": ours[0]["graph"]},
    }
    for key, name in (("step_cpu_s_median", "step_cpu_s"), ("peak_rss_steps_delta_mib", "step_memory_mib")):
        a, o = median(anchor, key), median(ours, key)
        figures[name] = {
            "anchor": round(a, 4),
            "ours": round(o, 4),
            "ratio": round(o / a, 3),
            "anchor_runs": [round(r[key], 4) for r in anchor],
            "ours_runs": [round(r[key], 4) for r in ours],
        }
    for phase in ("fwd", "bwd"):  # wall seconds of the forward and of the backward (with its recomputation)
        key = f"{phase}_s_median"
        figures[f"{phase}_s"] = {"anchor": round(median(anchor, key), 4), "ours": round(median(ours, key), 4)}
    plans = [r["memory_plan"] | {"tensor_peak_mib": r["tensor_peak_mib"]} for r in ours if r.get("memory_plan")]
    if plans:
        for plan in plans:
            plan["predicted_over_measured"] = round(plan["predicted_peak_mib"] / plan["tensor_peak_mib"], 3)
        figures["memory_plan"] = plans
    time_target, memory_target = TARGETS[case]
    figures["targets"] = {"cpu_time_ratio": time_target, "memory_ratio": memory_target}
    figures["meets_targets"] = figures["step_cpu_s"]["ratio"] <= time_target and (
        memory_target is None or figures["step_memory_mib"]["ratio"] <= memory_target
    )
    return figures


def table(summaries: list[dict]) -> str:
    rows = [
        "| case | params anchor / ours | CPU s anchor | CPU s ours | ratio (target) | memory MiB anchor "
        "| memory MiB ours | ratio (target) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        t, m = s["step_cpu_s"], s["step_memory_mib"]
        time_target, memory_target = s["targets"]["cpu_time_ratio"], s["targets"]["memory_ratio"]
        rows.append(
            f"| {s['case']} | {s['params']['anchor']:,} / {s['params']['ours']:,} | {t['anchor']:.2f} | "
            f"{t['ours']:.2f} | {t['ratio']:.2f} (≤ {time_target}) | {m['anchor']:.0f} | {m['ours']:.0f} | "
            f"{m['ratio']:.2f} ({'≤ ' + str(memory_target) if memory_target else '—'}) |"
        )
    for s in summaries:
        for plan in s.get("memory_plan", []):
            rows.append(
                f"\n{s['case']} plan for {plan['budget_mib']:.0f} MiB: {plan['settings']}; predicted "
                f"{plan['predicted_peak_mib']:.0f} MiB, measured tensor peak {plan['tensor_peak_mib']:.0f} MiB "
                f"({plan['predicted_over_measured']:.2f})"
            )
    return "\n".join(rows)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["R", "T", "S"])
    p.add_argument("--rounds", type=positive_int, default=3, help="interleaved runs of each system per case")
    p.add_argument("--steps", type=positive_int, default=5, help="timed steps per run (median taken)")
    p.add_argument("--anchor-python", type=Path, default=ANCHOR_PYTHON)
    p.add_argument("--anchor-run", type=Path, default=ANCHOR_RUN, help="the anchor harness's run.py")
    p.add_argument(
        "--plan-budget-from-anchor",
        action="store_true",
        help="ours plans chunks and recomputation for the anchor's measured step memory (anchor runs first)",
    )
    args = p.parse_args(argv)
    for path, fix in ((args.anchor_python, "run bash ../shared/bench/anchor/setup.sh, or "), (args.anchor_run, "")):
        if not path.exists():
            raise SystemExit(f"{path} does not exist: {fix}pass --anchor-python and --anchor-run")

    anchor_cmd = [str(args.anchor_python), str(args.anchor_run)]
    ours_cmd = [sys.executable, str(script("step_time.py"))]
    results: dict[str, dict[str, list[dict]]] = {case: {"anchor": [], "ours": []} for case in args.cases}
    for round_index in range(args.rounds):
        for case in args.cases:
            flags = [*CASES[case], *COMMON, "--steps", str(args.steps)]
            order = [("anchor", anchor_cmd), ("ours", ours_cmd)]
            swap = round_index % 2 == 1 and not args.plan_budget_from_anchor
            for system, command in order[::-1] if swap else order:
                extra = []
                if system == "ours" and args.plan_budget_from_anchor:
                    budget_gb = results[case]["anchor"][-1]["peak_rss_steps_delta_mib"] / 1024
                    extra = ["--memory-budget-gb", f"{budget_gb:.4f}", "--optim", "adamw", "--live-tensors"]
                run = run_json([*command, *flags, *extra, "--label", case])
                results[case][system].append(run)
                print(f"round {round_index + 1} {case} {system}: {run['step_cpu_s_median']:.3f} CPU-s, "
                      f"{run['peak_rss_steps_delta_mib']:.0f} MiB", file=sys.stderr, flush=True)  # fmt: skip
    summaries = [case_summary(case, r["anchor"], r["ours"]) for case, r in results.items()]
    print(table(summaries), file=sys.stderr)
    report = {"benchmark": "compare_anchor", "cases": summaries}
    print(json.dumps(report))
    return report


if __name__ == "__main__":
    main()

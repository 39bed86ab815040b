"""The GPU proof kit's speed sections (``gpu_check.py``): our step time per case, backend and precision, the
anchor's (anemoi-models) on the same GPU, the attention kernels alone, and the targets computed from them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.anchor.compare_anchor import CASES
from benchmarks.gpu.gpu_kit import BudgetSpent, Kit, install_wheels
from benchmarks.gpu.gpu_report import Section, table
from benchmarks.script_runs import last_json, script

ANCHOR_SCRIPT = script("gpu_anchor.py")
ANCHOR_PINS = Path(__file__).with_name("gpu_anchor_wheels.txt")
ANCHOR_CASES = ("R", "T", "O96", "D", "D-infer")
ANCHOR_FLAGS = {"D-infer": ["--case", "D", "--mode", "infer", "--optim", "none"]}
"""gpu_anchor.py flags of a case that is not its own ``--case``: D-infer is D's forward without gradients."""
JUNIT = "gpu_tests.xml"

O96_GRID = ["--grid", "144x280", "--mesh-res", "5"]
D_MODEL = ["--channels", "1024", "--layers", "16", "--heads", "16", "--num-vars", "100", "--multistep", "2"]
D_MODEL += ["--num-chunks-processor", "2", "--optim", "adamw"]
GPU_CASES = {
    **CASES,
    "O96": [*O96_GRID, *CASES["R"][4:]],
    "D": [*O96_GRID, *D_MODEL],
    "D-planned": [*O96_GRID, *D_MODEL, "--memory-budget-gb", "64"],
    "O320-AIFS": ["--grid", "O320", "--mesh-res", "6", *D_MODEL, "--memory-budget-gb", "64"],
    "D-infer": [*O96_GRID, *D_MODEL, "--mode", "infer", "--optim", "none"],
}
BEST = ["--cuda-graphs", "--optim", "adamw", "--memory-budget-gb", "64"]
"""Ours at its best: the step replayed as a CUDA graph (training: with its fused AdamW update, which the anchor's R,
T and O96 rows do not have), chunks and recomputation planned for an 80 GB card."""
GPU_CASES |= {f"{case}-best": [*GPU_CASES[case], *BEST] for case in ("R", "T", "O96", "D")}
GPU_CASES["D-infer-best"] = [*GPU_CASES["D-infer"], "--cuda-graphs", "--memory-budget-gb", "64"]
GPU_CASES["tiny"] = TINY = ["--grid", "12x24", "--mesh-res", "1", "--channels", "16", "--layers", "2", "--heads", "4"]
GPU_CASES["tiny-best"] = [*TINY, *BEST]
"""step_time.py flags per case (after CHUNKS, so a case's own chunk flags win): compare_anchor's R, T and S; an
O96-class grid (144 x 280 = 40,320 points, like O96's; 10,242 mesh nodes) at R's model size, as in gpu_anchor.py;
D, anemoi's default model on it (1024 channels, 16 layers, processor chunks 2, 100 variables, AdamW step);
D-planned, the same with chunks and recomputation planned for an 80 GB card (64 GB, 80 % of it); O320-AIFS, the D
model on O320 (421,120 points) with mesh resolution 6 (40,962 nodes), planned for the same card; D-infer, D's forward
without gradients (inference)."""
CHUNKS = ["--num-chunks-mapper", "4", "--num-chunks-processor", "4"]
"""compare_anchor's chunking (4 mapper and 4 processor chunks, activation checkpointing on) for every case."""
RUNS = [
    ("D", "triton", "bf16-mixed"),
    ("D-best", "triton", "bf16-mixed"),
    ("R", "triton", "bf16-mixed"),
    ("R-best", "triton", "bf16-mixed"),
    ("O96-best", "triton", "bf16-mixed"),
    ("T-best", "triton", "bf16-mixed"),
    ("D-infer-best", "triton", "bf16-mixed"),
    ("T", "triton", "bf16-mixed"),
    ("O96", "triton", "bf16-mixed"),
    ("D-planned", "triton", "bf16-mixed"),
    ("O320-AIFS", "triton", "bf16-mixed"),
]
"""(case, graph-attention backend, precision) of the step-time runs the targets need, most important first (the
budget may end them)."""
MORE_RUNS = [
    ("D-infer", "triton", "bf16-mixed"),
    ("D", "triton", "32"),
    ("O96", "triton", "32"),
    ("R", "triton", "32"),
    ("R", "torch", "32"),
    ("T", "triton", "32"),
    ("R", "torch", "bf16-mixed"),
    ("S", "triton", "bf16-mixed"),
    ("S", "torch", "bf16-mixed"),
    ("S", "reference", "32"),
    ("O96", "torch", "bf16-mixed"),
]
"""The other backends and precisions, run last with the time left."""
FEW_STEPS = {"O320-AIFS": ["--steps", "5", "--warmup", "2"]}
"""Cases timed over fewer steps: one O320-AIFS step takes seconds, and the issue asks only for its time and peak."""
QUICK_RUNS = [("tiny", "triton", "bf16-mixed"), ("tiny-best", "triton", "bf16-mixed")]
STEP_FIELDS = ("step_s_median", "fwd_s_median", "bwd_s_median", "peak_mem_mib", "params", "graph", "loss_finite")
STEP_FIELDS += ("peak_rss_mib", "time_import_s", "time_graph_build_s", "time_model_build_s", "time_warmup_total_s")
STEP_FIELDS += ("memory_plan",)
TRITON_SPEEDUP = 3.0
"""The Triton graph attention at least this many times faster than our torch backend (forward + backward of one
processor layer)."""
CASE_TARGETS = {
    "R": {"step_time_ratio": 0.7, "memory_ratio": 0.5},
    "T": {"step_time_ratio": 0.7},
    "O96": {"step_time_ratio": 0.7},
    "D": {"step_time_ratio": 0.8, "memory_ratio": 0.6},
    "D-infer": {"step_time_ratio": 0.7},
}
"""Limits per anchor case (Triton, bf16-mixed, equal flags), ours over the anchor's: the GPU-speed issue's, and the
kit's first memory target at R."""
BEST_TARGETS = {"R": 0.4, "T": 0.4, "O96": 0.4, "D": 0.7, "D-infer": 0.5}
"""Step-time limits of ours at its best (``CASE-best``: CUDA graphs, planned chunks) over the anchor's case."""


def step_time(kit: Kit, section: Section) -> None:
    """The runs the targets need."""
    step_time_runs(kit, section, QUICK_RUNS if kit.quick else RUNS)


def step_time_more(kit: Kit, section: Section) -> None:
    """The other backends and precisions (none in a quick run)."""
    if kit.quick:
        section.skip("quick: no further runs")
        return
    step_time_runs(kit, section, MORE_RUNS)


def step_time_runs(kit: Kit, section: Section, runs: list[tuple[str, str, str]]) -> None:
    """One ``step_time.py --device`` process per run; a run that fails is a row with its error, one the budget
    leaves no time for a row saying so."""
    steps = ["--steps", "2", "--warmup", "1"] if kit.quick else ["--steps", "20", "--warmup", "5"]
    rows, failures = [], []
    section.data = {"runs": rows}
    for case, backend, precision in runs:
        flags = GPU_CASES[case] if case.startswith("tiny") else CHUNKS + GPU_CASES[case]
        flags = [*flags, *FEW_STEPS.get(case, steps), "--device", kit.device, "--precision", precision]
        flags += ["--graph-attention-backend", backend]
        row = {"case": case, "backend": backend, "precision": precision, "flags": flags}
        rows.append(row)
        if "--cuda-graphs" in flags and kit.device != "cuda":
            row["skipped"] = "CUDA graphs need a CUDA device"
            continue
        try:
            code, out, err = kit.run([kit.python, str(script("step_time.py")), *flags, "--label", case], 150)
        except BudgetSpent as spent:
            row["skipped"] = str(spent)
            continue
        if code == 0:
            row |= {k: last_json(out).get(k) for k in STEP_FIELDS}
        else:
            row["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            failures.append(f"{case} {backend} {precision}:\n{err[-1500:]}")
    section.lines += table(
        ["case", "backend", "precision", "step s (median)", "fwd s", "bwd s", "peak MiB", "warm-up s", "error"],
        [[r["case"], r["backend"], r["precision"], r.get("step_s_median"), r.get("fwd_s_median"), r.get("bwd_s_median"),
          r.get("peak_mem_mib"), r.get("time_warmup_total_s"), r.get("error") or r.get("skipped")] for r in rows],
    )  # fmt: skip
    skipped = sum("skipped" in r for r in rows)
    note = f"{len(rows) - skipped} runs" + (f", {skipped} left out (no CUDA, or no time left)" if skipped else "")
    note += "" if kit.device == "cuda" else " (CPU: wall time, no CUDA memory)"
    if failures:
        section.fail(f"{note}; {len(failures)} failed", "\n\n".join(failures))
    else:
        section.note = note


def anchor(kit: Kit, section: Section) -> None:
    """``gpu_anchor.py`` (anemoi-models, Triton backend) in bf16-mixed at ``ANCHOR_CASES``, with its wheels and
    graphs from the wheel folder (``anchor/``, ``anchor_graphs/``)."""
    if kit.device != "cuda":
        section.skip("the anchor runs on CUDA only")
        return
    wheels = kit.args.wheels / "anchor" if kit.args.wheels else None
    if wheels is None or not any(wheels.glob("*.whl")):
        section.skip(f"the anchor's wheels are missing: run make gpu-wheels ({ANCHOR_PINS.name} lists them)")
        return
    site = kit.args.work / "site-anchor"
    section.lines.append(f"- anchor wheels: {install_wheels(wheels, site)}")
    env = {**kit.env, "PYTHONPATH": os.pathsep.join([str(site), kit.env["PYTHONPATH"]])}
    graphs = kit.args.wheels / "anchor_graphs" if kit.args.wheels else None
    if graphs is None or not any(graphs.glob("*.pt")):
        section.skip("the anchor's graphs are missing: gpu_anchor.py --build-graphs .gpu-wheels/anchor_graphs")
        return
    rows, failures = [], []
    section.data = {"runs": rows}  # the rows so far, should the budget end the loop
    for case in ANCHOR_CASES:
        flags = [*ANCHOR_FLAGS.get(case, ["--case", case]), "--device", "cuda", "--precision", "bf16-mixed"]
        flags += ["--backend", "triton"]
        flags += ["--steps", "20", "--warmup", "5", "--graphs-dir", str(graphs)]
        code, out, err = kit.run([kit.python, str(ANCHOR_SCRIPT), *flags], 150, env=env)
        if code == 0:
            result = last_json(out)
            rows.append(
                {
                    "case": case,
                    "step_s_median": result.get("step_s_median"),
                    "peak_mem_mib": result.get("peak_mem_mib"),
                    "result": result,
                }
            )
        else:
            rows.append({"case": case, "error": err.strip().splitlines()[-1] if err.strip() else f"exit {code}"})
            failures.append(f"{case}:\n{err[-2000:]}")
    section.lines += table(
        ["case", "step s (median)", "peak MiB", "error"],
        [[r["case"], r.get("step_s_median"), r.get("peak_mem_mib"), r.get("error")] for r in rows],
    )
    if failures:
        section.fail(f"{len(failures)} of {len(rows)} anchor runs failed", "\n\n".join(failures))


def attention(kit: Kit, section: Section) -> None:
    """``attention.py`` graph and window attention per backend (no whole-model part), fp32 and bf16."""
    flags = [*TINY, "--window", "4", "--steps", "2"] if kit.quick else ["--steps", "20", "--warmup", "5"]
    rows, failures = [], []
    section.data = {"rows": rows}  # the rows so far, should the budget end the loop
    for dtype in ("float32",) if kit.quick else ("float32", "bfloat16"):
        code, out, err = kit.run(
            [kit.python, str(script("attention.py")), *flags, "--skip-model", "--dtype", dtype], 90
        )
        if code != 0:
            failures.append(f"{dtype}:\n{err[-2000:]}")
            continue
        report = last_json(out)
        rows += [{"dtype": dtype, **row} for row in report["backends"]]
    section.lines += table(
        ["attention", "backend", "dtype", "wall s", "peak MiB", "skipped"],
        [
            [r["attention"], r["backend"], r["dtype"], r.get("wall_s"), r.get("peak_mib"), r.get("skipped")]
            for r in rows
        ],
    )
    if failures:
        section.fail(f"{len(failures)} attention runs failed", "\n\n".join(failures))


def ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if not ours or not theirs else round(ours / theirs, 3)


def targets(sections: dict[str, Section], section: Section) -> None:
    """The issue's GPU targets from the other sections' figures (None where a figure is missing): per anchor case,
    our Triton bf16-mixed step time and peak memory over the anchor's (limits: ``CASE_TARGETS``), and the torch over
    Triton graph-attention time."""
    ours = {
        r["case"]: r
        for r in [*sections["step_time"].data.get("runs", []), *sections["step_time_more"].data.get("runs", [])]
        if "step_s_median" in r and (r["backend"], r["precision"]) == ("triton", "bf16-mixed")
    }
    theirs = {r["case"]: r for r in sections["anchor"].data.get("runs", []) if "step_s_median" in r}
    cases = {
        case: {
            "step_time_ratio": ratio(
                ours.get(case, {}).get("step_s_median"), theirs.get(case, {}).get("step_s_median")
            ),
            "memory_ratio": ratio(ours.get(case, {}).get("peak_mem_mib"), theirs.get(case, {}).get("peak_mem_mib")),
        }
        for case in ANCHOR_CASES
    }
    graph = {
        (r["dtype"], r["backend"]): r["wall_s"]
        for r in sections["attention"].data.get("rows", [])
        if r["attention"] == "graph" and "wall_s" in r
    }
    speedups = {
        dtype: ratio(graph.get((dtype, "torch")), graph.get((dtype, "triton"))) for dtype in ("float32", "bfloat16")
    }
    speedups = {k: v for k, v in speedups.items() if v is not None}

    def within(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    rows = [
        [f"{case} {name} ≤ {limit}", cases[case][name], within(cases[case][name], limit)]
        for case, limits in CASE_TARGETS.items()
        for name, limit in limits.items()
    ]
    for case, limit in BEST_TARGETS.items():
        best = ratio(ours.get(f"{case}-best", {}).get("step_s_median"), theirs.get(case, {}).get("step_s_median"))
        cases[case]["best_step_time_ratio"] = best
        rows.append([f"{case} best step_time_ratio ≤ {limit}", best, within(best, limit)])
    fast_enough = None if not speedups else min(speedups.values()) >= TRITON_SPEEDUP
    rows.append([f"graph attention torch / triton ≥ {TRITON_SPEEDUP}", json.dumps(speedups), fast_enough])
    met = {target: ok for target, _, ok in rows}
    section.data = {"cases": cases, "triton_speedup": speedups, "met": met}
    section.lines += table(
        ["case (Triton, bf16-mixed)", "step time ours / anchor", "peak memory ours / anchor", "ours at best / anchor"],
        [[case, c["step_time_ratio"], c["memory_ratio"], c.get("best_step_time_ratio")] for case, c in cases.items()],
    )
    section.lines += ["", *table(["target", "value", "met"], rows)]
    known = {target: ok for target, ok in met.items() if ok is not None}
    if not known:
        section.skip("no figure to compare: the step-time, anchor or attention figures are missing")
    else:
        section.note = f"{sum(known.values())} of {len(known)} targets met"

#!/usr/bin/env python3
"""GPU proof kit: on one CUDA machine, in one go, prove every GPU path and time the model against anemoi-models.

Writes ``gpu_report.md`` and ``gpu_report.json`` (plus ``gpu_tests.xml``, pytest's junit report) into ``--out``
(default ``$OUT``). Sections, each independent (a failure is recorded with its output's tail and the kit goes on):

- environment: python, torch, triton, CUDA, GPU, ``nvidia-smi``; the wheels of ``--wheels`` installed first;
- tests: ``pytest -m gpu tests/test_gpu.py`` (kernels compiled, torch.compile, CUDA graphs, snapshot, NCCL, ...);
- step_time: ``benchmarks/step_time.py --device cuda`` for cases R, T, S and O96, per graph-attention backend and
  precision: CUDA-event step time (median of 20 after 5 warm-up steps) and peak allocated memory;
- anchor: ``benchmarks/gpu_anchor.py`` (anemoi-models on the same GPU) when it is there;
- attention: ``benchmarks/attention.py`` per backend at one reference processor layer, fp32 and bf16;
- targets: our R bf16-mixed against the anchor's, Triton against torch graph attention (computed, not asserted);
- train, bench, profile: ``anemo-train``, ``anemo-bench`` and ``anemo-profile --doctor`` on the built-in dataset.

Sections past ``--budget-s`` seconds are skipped with a note. ``--device cpu --quick`` is a dry run at tiny sizes
(tests/test_gpu_check.py runs it), so the kit cannot rot between GPU runs. docs/gpu.md explains every line.

    python3 benchmarks/gpu_check.py --out /tmp/gpu            # wheels from .gpu-wheels/ when the folder exists
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from compare_anchor import CASES  # benchmarks/compare_anchor.py
from gpu_report import Section, table, write_reports

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
ANCHOR_SCRIPT = BENCHMARKS / "gpu_anchor.py"
ANCHOR_PINS = BENCHMARKS / "gpu_anchor_wheels.txt"
ANCHOR_CASES = ("R", "T", "O96", "D")
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
    ("R", "triton", "bf16-mixed"),
    ("R", "torch", "bf16-mixed"),
    ("T", "triton", "bf16-mixed"),
    ("O96", "triton", "bf16-mixed"),
    ("S", "triton", "bf16-mixed"),
    ("D-planned", "triton", "bf16-mixed"),
    ("O320-AIFS", "triton", "bf16-mixed"),
]
"""(case, graph-attention backend, precision) of the step-time runs the targets need, most important first (the
budget may end them)."""
MORE_RUNS = [
    ("R", "triton", "32"),
    ("R", "torch", "32"),
    ("T", "triton", "32"),
    ("O96", "triton", "32"),
    ("D", "triton", "32"),
    ("D-infer", "triton", "bf16-mixed"),
    ("S", "torch", "bf16-mixed"),
    ("S", "reference", "32"),
    ("O96", "torch", "bf16-mixed"),
]
"""The other backends and precisions, run last with the time left."""
TINY = ["--grid", "12x24", "--mesh-res", "1", "--channels", "16", "--layers", "2", "--heads", "4"]
QUICK_RUNS = [("tiny", "triton", "bf16-mixed")]
STEP_FIELDS = ("step_s_median", "fwd_s_median", "bwd_s_median", "peak_mem_mib", "params", "graph", "loss_finite")
STEP_FIELDS += ("peak_rss_mib", "time_import_s", "time_graph_build_s", "time_model_build_s", "time_warmup_total_s")
TINY_MODEL = ["graph.mesh_resolution=1", "model.num_channels=16", "model.num_heads=2", "model.processor.num_layers=1"]
TINY_MODEL += ["dataloader.batch_size.val=2", "dataloader.limit_batches.val=1", "training.val_climatology_dates=0"]
TARGETS = {"step_time_ratio": 0.7, "memory_ratio": 0.5, "triton_speedup": 3.0}
"""At R in bf16-mixed: our step time and peak memory at most these fractions of the anchor's; the Triton graph
attention at least this many times faster than our torch backend (forward + backward of one processor layer)."""


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


def json_line(stdout: str) -> dict:
    """The last line of ``stdout`` that parses as a JSON object."""
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON line in the output")


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


ENVIRONMENT_PROBE = """
import json, platform, torch
info = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available()}
for name in ("triton", "torch_geometric", "numpy", "hydra", "pydantic", "zarr", "anemo_like"):
    try:
        info[name] = __import__(name).__version__
    except Exception as exc:
        info[name] = f"missing: {type(exc).__name__}: {exc}"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info |= {"gpu": p.name, "capability": f"{p.major}.{p.minor}", "gpu_memory_gib": round(p.total_memory / 2**30, 1),
             "bf16_supported": torch.cuda.is_bf16_supported()}
print(json.dumps(info))
"""


def environment(kit: Kit, section: Section) -> None:
    """Versions of what the other sections use, as their subprocesses see them, and nvidia-smi."""
    section.lines += [f"- wheels: {kit.args.install_note}"]
    code, out, err = kit.run([kit.python, "-c", ENVIRONMENT_PROBE], 60)
    if code != 0:
        section.fail("the environment probe failed", err[-3000:])
        return
    info = json_line(out)
    section.data = info
    section.lines += [f"- {k}: {v}" for k, v in info.items()]
    missing = [k for k, v in info.items() if str(v).startswith("missing")]
    if missing:
        section.fail(f"cannot import {', '.join(missing)}")
    elif kit.device == "cuda" and not info["cuda_available"]:
        section.fail("torch sees no CUDA device")
    else:
        section.note = f"torch {info['torch']}, " + (info.get("gpu") or "no GPU")
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        smi = f"nvidia-smi: {exc}"
    section.data["nvidia_smi"] = smi
    section.lines += ["", "```text", smi.strip(), "```"]


def junit_results(path: Path) -> list[dict]:
    """Per test case of a junit xml: name, outcome (passed, failed, error, skipped), seconds, message."""
    results = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                message = (node.get("message") or node.text or "").strip()
                break
        results.append(
            {"test": case.get("name"), "outcome": outcome, "seconds": float(case.get("time", 0)), "message": message}
        )
    return results


def tests(kit: Kit, section: Section) -> None:
    """``pytest -m gpu tests/test_gpu.py`` with a junit report in the output folder."""
    junit = kit.args.out / JUNIT
    command = [kit.python, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-p", "no:cacheprovider"]
    code, out, err = kit.run([*command, f"--junitxml={junit}"], 220)
    if not junit.exists():
        section.fail(f"pytest wrote no junit report (exit {code})", (out + err)[-4000:])
        return
    results = junit_results(junit)
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("passed", "failed", "error", "skipped")}
    section.data = {"counts": counts, "exit": code, "tests": results}
    section.lines += table(
        ["test", "outcome", "seconds", "message"],
        [
            [r["test"], r["outcome"], f"{r['seconds']:.1f}", r["message"][:160].replace("|", "/").replace("\n", " ")]
            for r in results
        ],
    )
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    if counts["failed"] or counts["error"] or code not in (0, 5):
        section.fail(summary or f"pytest exit {code}", (out + err)[-4000:])
    elif counts["passed"] == 0:
        section.skip(f"{summary}: no CUDA device" if kit.device == "cpu" else summary)
    else:
        section.note = summary


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
        flags = TINY if case == "tiny" else CHUNKS + GPU_CASES[case]
        flags = [*flags, *steps, "--device", kit.device, "--graph-attention-backend", backend, "--precision", precision]
        row = {"case": case, "backend": backend, "precision": precision, "flags": flags}
        rows.append(row)
        try:
            code, out, err = kit.run([kit.python, str(BENCHMARKS / "step_time.py"), *flags, "--label", case], 150)
        except BudgetSpent as spent:
            row["skipped"] = str(spent)
            continue
        if code == 0:
            row |= {k: json_line(out).get(k) for k in STEP_FIELDS}
        else:
            row["error"] = err.strip().splitlines()[-1] if err.strip() else f"exit {code}"
            failures.append(f"{case} {backend} {precision}:\n{err[-1500:]}")
    section.lines += table(
        ["case", "backend", "precision", "step s (median)", "fwd s", "bwd s", "peak MiB", "warm-up s", "error"],
        [[r["case"], r["backend"], r["precision"], r.get("step_s_median"), r.get("fwd_s_median"), r.get("bwd_s_median"),
          r.get("peak_mem_mib"), r.get("time_warmup_total_s"), r.get("error") or r.get("skipped")] for r in rows],
    )  # fmt: skip
    skipped = sum("skipped" in r for r in rows)
    note = f"{len(rows) - skipped} runs" + (f", {skipped} left out: the time budget ran out" if skipped else "")
    note += "" if kit.device == "cuda" else " (CPU: wall time, no CUDA memory)"
    if failures:
        section.fail(f"{note}; {len(failures)} failed", "\n\n".join(failures))
    else:
        section.note = note


def anchor(kit: Kit, section: Section) -> None:
    """``gpu_anchor.py`` (anemoi-models, Triton backend) in bf16-mixed at ``ANCHOR_CASES``, with its wheels and
    graphs from the wheel folder (``anchor/``, ``anchor_graphs/``)."""
    if not ANCHOR_SCRIPT.exists():
        section.skip(f"{ANCHOR_SCRIPT.relative_to(REPO)} is not in this tree")
        return
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
        flags = ["--case", case, "--device", "cuda", "--precision", "bf16-mixed", "--backend", "triton"]
        flags += ["--steps", "20", "--warmup", "5", "--graphs-dir", str(graphs)]
        code, out, err = kit.run([kit.python, str(ANCHOR_SCRIPT), *flags], 150, env=env)
        if code == 0:
            result = json_line(out)
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
            [kit.python, str(BENCHMARKS / "attention.py"), *flags, "--skip-model", "--dtype", dtype], 90
        )
        if code != 0:
            failures.append(f"{dtype}:\n{err[-2000:]}")
            continue
        report = json_line(out)
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
    our Triton bf16-mixed step time and peak memory over the anchor's (targets at R), and the torch over Triton
    graph-attention time."""
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
    r_case = cases["R"]

    def within(value: float | None, limit: float) -> bool | None:
        return None if value is None else value <= limit

    met = {
        "step_time_ratio": within(r_case["step_time_ratio"], TARGETS["step_time_ratio"]),
        "memory_ratio": within(r_case["memory_ratio"], TARGETS["memory_ratio"]),
        "triton_speedup": None if not speedups else min(speedups.values()) >= TARGETS["triton_speedup"],
    }
    section.data = {"cases": cases, "triton_speedup": speedups, "targets": TARGETS, "met": met}
    section.lines += table(
        ["case (Triton, bf16-mixed)", "step time ours / anchor", "peak memory ours / anchor"],
        [[case, c["step_time_ratio"], c["memory_ratio"]] for case, c in cases.items()],
    )
    rows = [
        [f"R step time ratio ≤ {TARGETS['step_time_ratio']}", r_case["step_time_ratio"], met["step_time_ratio"]],
        [f"R peak memory ratio ≤ {TARGETS['memory_ratio']}", r_case["memory_ratio"], met["memory_ratio"]],
        [f"graph attention torch / triton ≥ {TARGETS['triton_speedup']}", json.dumps(speedups), met["triton_speedup"]],
    ]
    section.lines += ["", *table(["target", "value", "met"], rows)]
    known = [k for k, v in met.items() if v is not None]
    if not known:
        section.skip("no figure to compare: the step-time, anchor or attention figures are missing")
    else:
        section.note = ", ".join(f"{k} {'met' if met[k] else 'missed'}" for k in known)


def hydra_command(kit: Kit, module: str, run_dir: Path, overrides: list[str]) -> list[str]:
    """A Hydra command of the package on the built-in dataset (quickstart), its run folder in the work dir."""
    common = [
        "--config-name=quickstart",
        f"hydra.run.dir={run_dir}",
        f"system.paths.cache={kit.args.cache or kit.args.work / 'cache'}",
        f"system.hardware.accelerator={kit.device}",
        "diagnostics.plots=false",
        "diagnostics.progress_bar=false",
        *(TINY_MODEL if kit.quick else []),
    ]
    return [kit.python, "-m", f"anemo_like.cli.{module}", *common, *overrides]


def train(kit: Kit, section: Section) -> None:
    """``anemo-train`` on the built-in dataset (200 steps, batch 2; 3 steps quick): samples per second."""
    run_dir = kit.args.work / "train"
    steps = 3 if kit.quick else 200
    overrides = [
        f"training.max_steps={steps}",
        "training.val_every_n_steps=1000",
        "training.checkpoint_every_n_steps=1000",
    ]
    overrides += [f"diagnostics.log_every_n_steps={max(1, steps // 6)}"]
    overrides += [] if kit.quick else ["dataloader.limit_batches.val=2"]  # quick: TINY_MODEL sets it
    started = time.perf_counter()
    code, out, err = kit.run(hydra_command(kit, "train", run_dir, overrides), 150)
    if code != 0:
        section.fail(f"anemo-train exit {code}", (out + err)[-4000:])
        return
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if "it_per_s" in r]
    rate = statistics.median(r["it_per_s"] for r in train_records[1:] or train_records)
    section.data = {
        "steps": steps,
        "wall_s": round(time.perf_counter() - started, 1),
        "samples_per_s": round(2 * rate, 2),
        "loss_first": train_records[0]["train_loss"],
        "loss_last": train_records[-1]["train_loss"],
        "validation": [r for r in records if "it_per_s" not in r][-1:],
    }
    data = section.data
    section.note = (
        f"{data['samples_per_s']} samples/s (batch 2), loss {data['loss_first']:.3g} -> {data['loss_last']:.3g}"
    )
    section.lines += [f"- {k}: {v}" for k, v in section.data.items()]


def bench(kit: Kit, section: Section) -> None:
    """``anemo-bench``: samples per second reading only (io), computing only (synthetic) and both (full)."""
    quick = ["diagnostics.bench.warmup_batches=1", "diagnostics.bench.batches=2", "diagnostics.bench.modes=[full]"]
    batches = quick if kit.quick else []
    code, out, err = kit.run(hydra_command(kit, "bench", kit.args.work / "bench", batches), 90)
    if code != 0:
        section.fail(f"anemo-bench exit {code}", (out + err)[-4000:])
        return
    section.data = json_line(out)
    rates = {k: v for k, v in section.data.items() if k.endswith("_samples_per_s")}
    section.note = ", ".join(f"{k.removesuffix('_samples_per_s')} {v}/s" for k, v in rates.items())
    section.lines += [f"- {k}: {v}" for k, v in section.data.items()]


def profile(kit: Kit, section: Section) -> None:
    """``anemo-profile --doctor``: the doctor's findings (its whole report stays in the work folder)."""
    run_dir = kit.args.work / "profile"
    settings = {"warmup_steps": 1, "steps": 1, "profiled_steps": 1, "loader_batches": 2}
    steps = [f"diagnostics.profile.{k}={v}" for k, v in settings.items()] if kit.quick else []
    code, out, err = kit.run([*hydra_command(kit, "profile", run_dir, steps), "--doctor"], 120)
    doctor = run_dir / "profile" / "doctor.md"
    if code != 0 or not doctor.exists():
        section.fail(f"anemo-profile --doctor exit {code}", (out + err)[-4000:])
        return
    findings = doctor.read_text()
    section.data = {"doctor": findings}
    section.lines += findings.strip().splitlines()


SECTIONS: list[tuple[str, Callable[[Kit, Section], None]]] = [
    ("environment", environment),
    ("tests", tests),
    ("step_time", step_time),
    ("anchor", anchor),
    ("attention", attention),
    ("train", train),
    ("bench", bench),
    ("profile", profile),
    ("step_time_more", step_time_more),
]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="report folder (default: $OUT)")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of the kit itself")
    p.add_argument("--quick", action="store_true", help="tiny sizes and few steps (the CPU dry run)")
    p.add_argument("--budget-s", type=float, default=540.0, help="sections starting after this many seconds skip")
    default_wheels = REPO / ".gpu-wheels"
    p.add_argument(
        "--wheels",
        type=lambda text: Path(text) if text else None,
        default=default_wheels if default_wheels.is_dir() else None,
        help="wheel folder to install first (default: .gpu-wheels/ when it exists; '': use what is installed)",
    )
    p.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    p.add_argument("--cache", type=Path, default=None, help="built-in dataset and graph cache (default: WORK/cache)")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required when $OUT is not set")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, clock = datetime.now(timezone.utc), time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work = args.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    budget = Budget(args.budget_s)
    site = None
    if args.wheels is not None:
        site = args.work / "site"
        args.install_note = install_wheels(args.wheels, site)
    else:
        args.install_note = "none given: the installed packages are used"
    kit = Kit(args, kit_environment(site), budget)
    sections = {name: Section(name) for name, _ in SECTIONS}
    for name, run in SECTIONS:
        section = sections[name]
        start = time.monotonic()
        if budget.left() < 10:
            section.skip(f"skipped: the {args.budget_s:.0f} s budget is spent")
            continue
        try:
            run(kit, section)
        except BudgetSpent as spent:
            section.skip(f"skipped: {spent}")
            section.error = spent.output[-4000:]
        except Exception:
            section.fail("the kit itself failed in this section", traceback.format_exc())
        section.seconds = round(time.monotonic() - start, 1)
        print(
            f"gpu_check: {name}: {section.status} {section.seconds:.0f} s {section.note}", file=sys.stderr, flush=True
        )
    sections["targets"] = Section("targets")
    targets(sections, sections["targets"])
    meta = {
        "device": args.device,
        "quick": args.quick,
        "started": started.isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - clock, 1),
        "budget_s": args.budget_s,
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
    }
    md, _ = write_reports(args.out, meta, list(sections.values()))
    print(md.read_text())
    return 1 if any(s.status == "fail" for s in sections.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

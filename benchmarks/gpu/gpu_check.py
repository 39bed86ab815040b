#!/usr/bin/env python3
"""GPU proof kit: on one CUDA machine, in one go, prove every GPU path and time the model against anemoi-models.

Writes ``gpu_report.md`` and ``gpu_report.json`` (plus ``gpu_tests.xml``, pytest's junit report) into ``--out``
(default ``$OUT``). Sections, each independent (a failure is recorded with its output's tail and the kit goes on):

- environment: python, torch, triton, CUDA, GPU, ``nvidia-smi``; the wheels of ``--wheels`` installed first;
- tests: ``pytest -m gpu tests/test_gpu.py`` (kernels compiled, torch.compile, CUDA graphs, snapshot, NCCL, ...);
- step_time: ``benchmarks/speed/step_time.py --device cuda`` for cases R, T, S and O96, per graph-attention backend and
  precision: CUDA-event step time (median of 20 after 5 warm-up steps) and peak allocated memory;
- anchor: ``benchmarks/gpu/gpu_anchor.py`` (anemoi-models on the same GPU) when it is there;
- attention: ``benchmarks/speed/attention.py`` per backend at one reference processor layer, fp32 and bf16;
- targets: our R bf16-mixed against the anchor's, Triton against torch graph attention (computed, not asserted);
- train, bench, profile: ``anemo-train``, ``anemo-bench`` and ``anemo-profile --doctor`` on the built-in dataset.

Sections past ``--budget-s`` seconds, or left out of ``--sections``, are skipped with a note. ``--device cpu
--quick`` is a dry run at tiny sizes (tests/test_gpu_check.py runs it), so the kit cannot rot between GPU runs.
docs/gpu.md explains every line.

    python3 benchmarks/gpu/gpu_check.py --out /tmp/gpu            # wheels from .gpu-wheels/ when the folder exists
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
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.gpu.gpu_kit import Budget, BudgetSpent, Kit, install_wheels, kit_environment
from benchmarks.gpu.gpu_report import Section, table, write_reports
from benchmarks.gpu.gpu_speed import anchor, attention, step_time, step_time_more, targets
from benchmarks.script_runs import REPO, last_json

JUNIT = "gpu_tests.xml"
TINY_MODEL = ["graph.mesh_resolution=1", "model.num_channels=16", "model.num_heads=2", "model.processor.num_layers=1"]
TINY_MODEL += ["dataloader.batch_size.val=2", "dataloader.limit_batches.val=1", "training.val_climatology_dates=0"]


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
    info = last_json(out)
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
    """``pytest -m gpu tests/test_gpu.py`` (only ``--tests-k``'s when given) with a junit report in the output
    folder."""
    junit = kit.args.out / JUNIT
    command = [kit.python, "-m", "pytest", "-m", "gpu", "tests/test_gpu.py", "-q", "-p", "no:cacheprovider"]
    command += ["-k", kit.args.tests_k] if kit.args.tests_k else []
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
    section.data = last_json(out)
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
    names = [name for name, _ in SECTIONS]
    p.add_argument(
        "--sections",
        type=lambda text: text.split(","),
        default=names,
        help=f"comma-separated sections to run, in the kit's order (default: all: {','.join(names)})",
    )
    p.add_argument("--tests-k", default="", help="pytest -k expression: run only these GPU tests (default: all)")
    args = p.parse_args(argv)
    unknown = sorted(set(args.sections) - set(names))
    if unknown:
        p.error(f"--sections: unknown {', '.join(unknown)}; expected some of {', '.join(names)}")
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
        if name not in args.sections:
            section.skip("not asked for (--sections)")
            continue
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

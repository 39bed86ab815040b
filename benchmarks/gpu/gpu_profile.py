#!/usr/bin/env python3
"""GPU profiles of both packages, side by side: per training step, the kernels launched, the top kernels by GPU
time and the GPU's idle time between kernels (host gaps), from torch.profiler. Prints ONE JSON line per run and
writes them, with a markdown table, into ``--out``.

Runs ``step_time.py --profile-steps`` (ours: Triton, bf16-mixed, the kit's chunking) and ``gpu_anchor.py
--profile-steps`` (anemoi-models: Triton, bf16-mixed) at the kit's cases (default O96 and D), with the wheels and
graphs of ``gpu_check.py``. On the GPU machine, after or instead of the kit:

    python3 benchmarks/gpu/gpu_profile.py --out "$OUT"                 # about 3 minutes on an H100
    python3 benchmarks/gpu/gpu_profile.py --out /tmp/p --device cpu --cases S   # dry run of the script itself

``kernels/step`` counts every device event (kernels, memcpy, memset); ``idle`` is 1 - (union of the kernels' time)
/ (first kernel start to last kernel end): the share of the step the GPU waits for the host.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.gpu.gpu_anchor_setup import CASES as ANCHOR_CASES
from benchmarks.gpu.gpu_kit import install_wheels, kit_environment
from benchmarks.gpu.gpu_report import table
from benchmarks.gpu.gpu_speed import ANCHOR_SCRIPT, CHUNKS, GPU_CASES
from benchmarks.script_runs import REPO, last_json, script


def anchor_graph(graphs: Path, case: str) -> Path | None:
    """The anchor's graph file for ``case`` (a case may share another's), None when gpu_anchor.py has no such case."""
    if case not in ANCHOR_CASES:
        return None
    return graphs / f"{ANCHOR_CASES[case].get('graph', case)}.pt"


def run(command: list[str], env: dict[str, str], timeout: float) -> dict:
    """One process; its JSON line, or the error."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]}
    return last_json(done.stdout)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=os.environ.get("OUT"), help="report folder (default: $OUT)")
    p.add_argument("--cases", nargs="+", choices=sorted(GPU_CASES), default=["O96", "D"])
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run")
    p.add_argument("--steps", type=int, default=3, help="profiled steps, after 3 warm-up and 3 timed ones")
    p.add_argument("--wheels", type=Path, default=REPO / ".gpu-wheels", help="gpu_check.py's wheels")
    p.add_argument("--timeout-s", type=float, default=150.0, help="per run")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required when $OUT is not set")
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu-profile-"))
    site = work / "site" if any(args.wheels.glob("*.whl")) else None
    if site is not None:
        install_wheels(args.wheels, site)
    env = kit_environment(site)
    anchor_env = dict(env)
    if any((args.wheels / "anchor").glob("*.whl")):
        install_wheels(args.wheels / "anchor", work / "site-anchor")
        anchor_env["PYTHONPATH"] = os.pathsep.join([str(work / "site-anchor"), env["PYTHONPATH"]])
    steps = ["--warmup", "3", "--steps", "3", "--profile-steps", str(args.steps), "--device", args.device]
    precision = ["--precision", "bf16-mixed"] if args.device == "cuda" else []
    rows = []
    for case in args.cases:
        ours = [sys.executable, str(script("step_time.py")), *CHUNKS, *GPU_CASES[case], *steps, *precision]
        ours += ["--graph-attention-backend", "triton" if args.device == "cuda" else "torch"]
        rows.append({"case": case, "system": "anemo_like", **run(ours, env, args.timeout_s)})
        graph = anchor_graph(args.wheels / "anchor_graphs", case)
        if graph is not None and not graph.exists():
            rows.append({"case": case, "system": "anemoi-models", "skipped": f"no anchor graph {graph}"})
        elif graph is not None:
            anchor = [sys.executable, str(ANCHOR_SCRIPT), "--case", case, *steps, *precision, "--graph", str(graph)]
            anchor += ["--backend", "triton" if args.device == "cuda" else "pyg"]
            rows.append({"case": case, "system": "anemoi-models", **run(anchor, anchor_env, args.timeout_s)})
    with open(args.out / "gpu_profile.jsonl", "w") as f:
        for row in rows:
            line = json.dumps(row)
            print(line, flush=True)
            f.write(line + "\n")
    lines = table(
        ["case", "system", "step s", "kernels/step", "GPU busy ms/step", "idle", "top kernel", "error"],
        [
            [r["case"], r["system"], r.get("step_s_median"), (r.get("profile") or {}).get("kernels_per_step"),
             (r.get("profile") or {}).get("gpu_busy_ms_per_step"), (r.get("profile") or {}).get("gpu_idle_fraction"),
             ((r.get("profile") or {}).get("top_kernels") or [{}])[0].get("name"), r.get("error") or r.get("skipped")]
            for r in rows
        ],
    )  # fmt: skip
    (args.out / "gpu_profile.md").write_text("# GPU profiles\n\n" + "\n".join(lines) + "\n")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Host work per training step: aten operators dispatched per forward+backward step, per processor layer, and the
device-to-host syncs among them, for our graph-attention paths and for the anchor (anemoi-models). Prints ONE JSON
line per (case, path).

Every dispatched operator is at least one kernel launch on a GPU plus Python and dispatcher work on the host; at
the sizes where a GPU is fast, this count sets the step's pace. It does not depend on the machine, so it is
measured here, on CPU, with 1 thread.

    python benchmarks/speed/host_overhead.py                        # cases S and R, every path (about 15 minutes)
    python benchmarks/speed/host_overhead.py --cases S --paths torch triton

Paths:
- ``torch``: the ``torch`` backend with CPU blocks (``model.block_elements`` auto on CPU: 2^18 elements);
- ``torch-gpu-blocks``: the same with the blocks a GPU gets by default (2^24);
- ``reference``: plain autograd over all edges at once;
- ``triton``: the Triton path as it runs on a GPU (its blocks), its two custom ops stand-ins on CPU
  (``step_time.py --triton-stand-in``), each counted as one operator;
- ``anchor``: ``../shared/bench/anchor/run.py`` (anemoi-models, PyG attention), counted by the shared opcount tool's
  ``sitecustomize.py`` as the difference of a 3-step and a 1-step run; its harness's per-step loss read (one
  ``detach`` and one ``_local_scalar_dense``) is subtracted, as ours is left out of the count.

Ops per layer: (ops at L layers - ops at L/2 layers) / (L/2), with the same layers per checkpoint segment, so each
layer carries its share of the segment overhead. Steps are those of ``compare_anchor.py``: mapper chunks 4,
activation checkpointing, batch 1, no optimiser step. ``bf16_casts_per_step``: the dtype casts of the same step in
bf16-mixed (614 at S on the triton path before linear weights were cast once per step in one multi-tensor copy, 112
after).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from anemo_like.models.ops.workspace import GPU_BLOCK_ELEMENTS
from anemo_like.profiling.op_count import is_sync
from benchmarks.script_runs import ANCHOR_PYTHON, ANCHOR_RUN, SHARED, run_checked, run_json, script
from benchmarks.speed.step_args import REFERENCE, parse_args

OPCOUNT = SHARED / "tools" / "opcount"

CASES = {
    "R": REFERENCE,
    "S": ["--grid", "32x64", "--mesh-res", "3", "--channels", "128", "--layers", "4", "--heads", "16"],
}
PATHS = {
    "torch": ["--graph-attention-backend", "torch"],
    "torch-gpu-blocks": ["--graph-attention-backend", "torch", "--block-elements", str(GPU_BLOCK_ELEMENTS)],
    "reference": ["--graph-attention-backend", "reference"],
    "triton": ["--graph-attention-backend", "triton", "--triton-stand-in", "--block-elements", str(GPU_BLOCK_ELEMENTS)],
    "anchor": ["--graph-attention-backend", "pyg"],
}
BF16 = ["--precision", "bf16-mixed"]
CASTS = ("aten._to_copy.default", "aten._foreach_copy_.default")
"""Dtype casts (one tensor, or a list in one multi-tensor kernel): bf16-mixed steps count them (autocast's casts of
weights and activations, and their gradients' casts back); the anchor harness runs fp32 only, so its row has none."""
ANCHOR_LOSS_READ = {"aten.detach.default": 1, "aten._local_scalar_dense.default": 1}
"""What the anchor harness's ``float(loss.detach())`` dispatches per step."""


def case_flags(case: str, layers: int) -> list[str]:
    """The flags of ``case`` at ``layers`` processor layers, with the case's layers per checkpoint segment, 8
    variables, 2 input steps and 4 mapper chunks (flags both harnesses take)."""
    args = parse_args(CASES[case])
    segments = max(1, layers // (args.layers // args.num_chunks_processor))
    sizes = ["--layers", str(layers), "--num-chunks-processor", str(segments), "--num-chunks-mapper", "4"]
    return [*CASES[case], *sizes, "--num-vars", "8", "--multistep", "2"]


def ours(flags: list[str]) -> dict[str, int]:
    """Operators per step by name, from one ``step_time.py --count-ops`` process (fp32 unless ``flags`` say)."""
    command = [sys.executable, script("step_time.py"), *flags, "--threads", "1", "--warmup", "1", "--steps", "1"]
    return run_json([*command, "--count-ops"])["ops"]["by_name"]


def anchor(flags: list[str]) -> dict[str, int]:
    """Operators per step by name of the anchor harness: (3-step run - 1-step run) / 2, the loss read left out."""
    counts = []
    for steps in (1, 3):
        with tempfile.TemporaryDirectory() as folder:
            names = Path(folder) / "names.json"
            env = {**os.environ, "OPCOUNT_OUT": str(Path(folder) / "total"), "OPCOUNT_NAMES": str(names)}
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OPCOUNT), env.get("PYTHONPATH")]))
            command = [str(ANCHOR_PYTHON), str(ANCHOR_RUN), *flags, "--threads", "1", "--warmup", "1"]
            run_checked([*command, "--steps", str(steps)], env=env)
            counts.append(json.loads(names.read_text()))
    one, three = counts
    per_step = {name: (three.get(name, 0) - one.get(name, 0)) // 2 for name in set(one) | set(three)}
    for name, n in ANCHOR_LOSS_READ.items():
        per_step[name] = per_step.get(name, 0) - n
    return {name: n for name, n in per_step.items() if n}


def measure(case: str, path: str) -> dict:
    """The JSON line of one (case, path)."""
    count = anchor if path == "anchor" else ours
    layers = parse_args(CASES[case]).layers
    full, half = (count([*case_flags(case, n), *PATHS[path]]) for n in (layers, layers // 2))
    total = sum(full.values())
    syncs = {name: n for name, n in sorted(full.items()) if is_sync(name)}
    bf16 = None if path == "anchor" else ours([*case_flags(case, layers), *PATHS[path], *BF16])
    casts = None if bf16 is None else sum(bf16.get(name, 0) for name in CASTS)
    return {
        "benchmark": "host_overhead",
        "case": case,
        "path": path,
        "system": "anemoi-models" if path == "anchor" else "anemo_like",
        "layers": layers,
        "ops_per_step": total,
        "ops_per_layer": round((total - sum(half.values())) / (layers // 2), 1),
        "syncs_per_step": sum(syncs.values()),
        "syncs": syncs,
        "bf16_casts_per_step": casts,
        "top_ops": dict(sorted(full.items(), key=lambda kv: -kv[1])[:8]),
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=["S", "R"])
    p.add_argument("--paths", nargs="+", choices=list(PATHS), default=list(PATHS))
    args = p.parse_args(argv)
    paths = list(args.paths)
    if "anchor" in paths and not (ANCHOR_RUN.exists() and ANCHOR_PYTHON.exists()):
        setup = f"bash {SHARED}/bench/anchor/setup.sh"
        print(f"anchor skipped: needs {ANCHOR_RUN} and {ANCHOR_PYTHON} ({setup})", file=sys.stderr)
        paths.remove("anchor")
    for case in args.cases:
        for path in paths:
            print(json.dumps(measure(case, path)), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Every command of the package, end to end, on an operational-size grid (default O320, 421,120 points).

Writes a synthetic anemoi-datasets zarr on the grid (built-in variables, 6-hourly), then runs, one process each:
``anemo-train`` (quickstart model on the grid's mesh: graph build and cache, the loader, chunked training
steps, validation, the outputs), ``anemo-train`` again (the graph from its cache), ``anemo-infer`` (a 5-day
forecast with ``ANEMOI_INFERENCE_NUM_CHUNKS_*``, verified), ``anemo-profile`` (phases and memory; without
torch.profiler, ``profiled_steps=0``, whose event processing needs over 10 GiB at O320) and ``anemo-bench``. For each it
records the exit status, the wall seconds and the peak memory of its process tree (proportional set sizes, so
pages forked loader workers share count once; sampled every 0.2 s), and prints ONE JSON line. The model is the
quickstart's (64 channels, 4 layers) on the grid's mesh, with every chunk count and recomputation switch left to
the memory plan for ``--memory-budget-gb``:

    python benchmarks/scaling/operational_grid.py                       # O320, mesh r6: about 15 minutes on 2 cores
    python benchmarks/scaling/operational_grid.py --grid O96 --mesh-res 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import console_script, script

COMPONENTS = ("encoder", "processor", "decoder")
DATES = 48
"""6-hourly dates from 2000-10-25: training to 10-30, validation and the 5-day forecast's truth after."""


def _pss_mib(pid: int) -> float:
    """Proportional set size of ``pid``, MiB: pages shared with other processes (forked loader workers) counted
    once over all of them, unlike RSS."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except (OSError, IndexError, ValueError):
        pass
    return 0.0


def tree_memory_mib(root: int) -> float:
    """Memory of ``root`` and its descendants (loader workers), MiB: the sum of their proportional set sizes."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier += children
    return sum(_pss_mib(pid) for pid in tree)


def run_measured(name: str, command: list[str], env: dict[str, str] | None = None) -> dict:
    """Run ``command``; exit status, wall seconds, peak memory of its process tree (PSS), its last line."""
    start, peak = time.perf_counter(), 0.0
    with tempfile.TemporaryFile("w+") as log:
        child = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
        )
        while child.poll() is None:
            peak = max(peak, tree_memory_mib(child.pid))
            time.sleep(0.2)
        log.seek(0)
        lines = log.read().strip().splitlines()
    result = {
        "command": name,
        "exit": child.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "peak_pss_mib": round(peak, 1),
    }
    print(f"{name}: exit {child.returncode}, {result['wall_s']} s, {peak:.0f} MiB", file=sys.stderr, flush=True)
    if child.returncode != 0:
        result["log_tail"] = lines[-15:]
    plan = [line.split(" - ", 1)[-1] for line in lines if "memory plan" in line]
    return result | {"last_line": lines[-1] if lines else ""} | ({"memory_plan": plan} if plan else {})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="O320")
    p.add_argument("--mesh-res", type=int, default=6)
    p.add_argument("--steps", type=int, default=4, help="training steps of each anemo-train")
    p.add_argument("--memory-budget-gb", type=float, default=3.0, help="for the memory plan")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="anemo-operational-") as tmp:
        folder = Path(tmp)
        dataset, run = folder / f"{args.grid}.zarr", folder / "run"
        cache = f"system.paths.cache={folder / 'cache'}"
        made = [sys.executable, str(script("synthetic_dataset.py")), "--grid", args.grid, "--dates", str(DATES)]
        common = [
            "--config-name=quickstart",
            f"data.dataset={dataset}",
            'data.splits.train.end="2000-10-30T18:00:00"',
            'data.splits.val.start="2000-10-31T00:00:00"',
            f"graph.mesh_resolution={args.mesh_res}",
            "diagnostics.progress_bar=false",
            cache,
            f"system.hardware.memory_budget_gb={args.memory_budget_gb}",
            *(f"model.{c}.{key}=auto" for c in COMPONENTS for key in ("num_chunks", "gradient_checkpointing")),
        ]
        train = [
            *common,
            f"training.max_steps={args.steps}",
            f"training.val_every_n_steps={args.steps}",
            f"training.checkpoint_every_n_steps={args.steps}",
            "training.val_climatology_dates=0",
            "dataloader.batch_size.val=2",  # the default 8 validates 4 training batches at once: 9 GiB at O320
        ]
        infer = [
            f"checkpoint={run / 'inference.pt'}",
            "dates=[2000-10-31T06]",
            "lead_time=5d",
            f"output={folder / 'forecast.nc'}",
            "verify=true",
            "verification.climatology_dates=8",
        ]
        chunks = {"ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER": "8", "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR": "4"}
        bench = [*common, "diagnostics.bench.batches=3", "diagnostics.bench.warmup_batches=1"]
        profile = ["diagnostics.profile.profiled_steps=0", "diagnostics.profile.loader_batches=4"]
        steps = [
            ("synthetic dataset", [*made, "--out", str(dataset)], None),
            ("anemo-train", [console_script("anemo-train"), *train, f"hydra.run.dir={run}"], None),
            (
                "anemo-train (cached graph)",
                [console_script("anemo-train"), *train, f"hydra.run.dir={folder / 'run2'}"],
                None,
            ),
            ("anemo-infer 5 days", [console_script("anemo-infer"), *infer], chunks),
            (
                "anemo-profile",
                [console_script("anemo-profile"), *common, *profile, f"hydra.run.dir={folder / 'profile'}"],
                None,
            ),
            ("anemo-bench", [console_script("anemo-bench"), *bench, f"hydra.run.dir={folder / 'bench'}"], None),
        ]
        results = [run_measured(name, command, env) for name, command, env in steps]
    print(json.dumps({"benchmark": "operational_grid", "grid": args.grid, "mesh_res": args.mesh_res, "runs": results}))


if __name__ == "__main__":
    main()

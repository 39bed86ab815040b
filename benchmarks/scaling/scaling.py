#!/usr/bin/env python3
"""Cost against grid size: octahedral grids O48 to O320, ours and the anchor (anemoi-models) side by side.

For each grid (mesh scaled with it: O48 r4, O96 r5, O160 r5, O320 r6) at 256 channels, 8 processor layers,
16 heads, batch 1, the default chunking (mappers 4, processor 2 segments, recomputation on), one torch thread:

- ours: ``benchmarks/speed/step_time.py`` (graph build seconds and peak RSS, forward + backward + AdamW CPU seconds
  per step, step memory = VmHWM during the steps above the RSS before them);
- the anchor: ``benchmarks/anchor/anchor_grid.py`` (``../shared/bench/anchor/run.py`` on the same points), stopped at
  ``--anchor-memory-cap-gb`` of resident memory or ``--anchor-timeout-s``, recorded with where it stopped;
- "ours planned": ours with ``--memory-budget-gb`` = ``--planned-share`` (0.3) x the anchor's step memory, the
  fastest chunking and recomputation the memory plan predicts to fit;
- reading one sample: ``anemo-bench`` io mode on a synthetic anemoi-datasets zarr of the grid (built-in
  variables, 16 dates);
- on the largest grid: ``anemo-bench`` in all modes (is the loader the bound?) and ``benchmarks/scaling/sharding.py``
  over 2 and 4 gloo processes (per-rank peak memory, step time, bytes communicated).

Prints one JSON line per row as it goes and, with ``--report DIR``, writes ``DIR/scaling.md`` (the table with
per-grid-point costs) and ``DIR/scaling.png`` (the cost curves). About 45 minutes on a 2-core machine:

    python benchmarks/scaling/scaling.py --report docs/images
    python benchmarks/scaling/scaling.py --grids O48 O96 --no-anchor --no-sharded   # a quick look
    python benchmarks/scaling/scaling.py --from results.jsonl --report docs/images   # redraw from saved lines
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import ANCHOR_PYTHON, last_json, print_json, script

MESH = {"O48": 4, "O96": 5, "O160": 5, "O320": 6}
MODEL = ["--channels", "256", "--layers", "8", "--heads", "16", "--num-vars", "8", "--multistep", "2"]
CHUNKS = ["--num-chunks-mapper", "4", "--num-chunks-processor", "2"]
RUN = ["--threads", "1", "--optim", "adamw"]


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_capped(command: list[str], *, timeout_s: float, memory_cap_mib: float | None = None) -> dict:
    """Run ``command``; the last JSON line it printed, or {"stopped": why, ...} when it failed, ran past
    ``timeout_s`` or past ``memory_cap_mib`` of resident memory (then it is killed, so the machine survives)."""
    start, peak = time.perf_counter(), 0.0
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, text=True)
        while child.poll() is None:
            peak = max(peak, rss_mib(child.pid))
            elapsed = time.perf_counter() - start
            over_memory = memory_cap_mib is not None and peak > memory_cap_mib
            if elapsed > timeout_s or over_memory:
                child.kill()
                child.wait()
                why = f"memory cap {memory_cap_mib:.0f} MiB" if over_memory else f"time limit {timeout_s:.0f} s"
                return {"stopped": why, "after_s": round(elapsed, 1), "peak_rss_seen_mib": round(peak, 1)}
            time.sleep(0.5)
        out.seek(0)
        err.seek(0)
        printed = out.read()
        if child.returncode != 0 or not printed.strip():
            tail = (printed + err.read())[-1500:]  # the commands log to stdout, their errors too
            return {"stopped": f"exit {child.returncode}", "output_tail": tail, "peak_rss_seen_mib": round(peak, 1)}
        return last_json(printed)


def model_row(
    system: str, grid: str, points_file: Path, args: argparse.Namespace, budget_gb: float | None = None
) -> dict:
    """One training-step measurement; ``budget_gb``: ours with the memory plan for that budget instead of the
    default chunking (``system`` then says so)."""
    flags = ["--grid", grid, "--mesh-res", str(MESH[grid]), *MODEL, *CHUNKS, *RUN]
    flags += ["--warmup", str(args.warmup), "--steps", str(args.steps)]
    if budget_gb is not None:
        flags += ["--memory-budget-gb", f"{budget_gb:.4f}", "--live-tensors"]
    if system.startswith("ours"):
        result = run_capped([sys.executable, str(script("step_time.py")), *flags], timeout_s=args.timeout_s)
    else:
        command = [str(args.anchor_python), str(script("anchor_grid.py")), "--points", str(points_file), *flags]
        cap = args.anchor_memory_cap_gb * 1024
        result = run_capped(command, timeout_s=args.anchor_timeout_s, memory_cap_mib=cap)
    return summarize_model(system, grid, result)


def summarize_model(system: str, grid: str, result: dict) -> dict:
    row = {"row": "model", "system": system, "grid": grid, "mesh_res": MESH[grid]}
    if "stopped" in result:
        return row | result
    points = result["graph"]["data_nodes"]
    return row | {
        "points": points,
        "hidden_nodes": result["graph"]["hidden_nodes"],
        "edges": {k: v for k, v in result["graph"].items() if k.startswith("edges")},
        "params": result["params"],
        "graph_build_s": result["time_graph_build_s"],
        "graph_build_peak_rss_mib": result["peak_rss_graph_build_mib"],
        "step_cpu_s": result["step_cpu_s_median"],
        "step_wall_s": result["step_s_median"],
        "step_memory_mib": result["peak_rss_steps_delta_mib"],
        "peak_rss_mib": result["peak_rss_mib"],
        "step_cpu_us_per_point": round(1e6 * result["step_cpu_s_median"] / points, 2),
        "step_memory_kib_per_point": round(1024 * result["peak_rss_steps_delta_mib"] / points, 3),
        "memory_plan": result.get("memory_plan"),
        "tensor_peak_mib": result.get("tensor_peak_mib"),
    }


def write_points(grid: str, folder: Path) -> Path:
    import numpy as np

    from anemo_like.data.grids import grid_from_name

    points = grid_from_name(grid)
    path = folder / f"{grid}.npz"
    np.savez(path, latitudes=points.latitudes, longitudes=points.longitudes)
    return path


def bench_overrides(dataset: Path, run_dir: Path) -> list[str]:
    return [
        "--config-name=quickstart",
        f"data.dataset={dataset}",
        'data.splits.train.end="2000-10-27T18:00:00"',
        'data.splits.val.start="2000-10-28T00:00:00"',
        "training.val_climatology_dates=0",
        "diagnostics.progress_bar=false",
        f"hydra.run.dir={run_dir}",
    ]


def read_row(grid: str, folder: Path, args: argparse.Namespace) -> dict:
    """Seconds per sample read and normalised by the training loader (anemo-bench io mode, 20 batches of 2)."""
    dataset = folder / f"{grid}.zarr"
    made = run_capped(
        [sys.executable, str(script("synthetic_dataset.py")), "--grid", grid, "--dates", "16", "--out", str(dataset)],
        timeout_s=args.timeout_s,
    )
    if "stopped" in made:
        return {"row": "read", "grid": grid} | made
    overrides = [*bench_overrides(dataset, folder / f"bench-{grid}"), "diagnostics.bench.modes=[io]"]
    result = run_capped([sys.executable, "-m", "anemo_like.cli.bench", *overrides], timeout_s=args.timeout_s)
    if "stopped" in result:
        return {"row": "read", "grid": grid} | result
    rate = result["io_samples_per_s"]
    return {"row": "read", "grid": grid, "samples_per_s": rate, "sample_read_s": round(1 / rate, 4)}


def bound_row(grid: str, folder: Path, args: argparse.Namespace) -> dict:
    """anemo-bench in all modes on the grid's dataset, quickstart model with the grid's mesh: the bound."""
    overrides = bench_overrides(folder / f"{grid}.zarr", folder / f"bench-all-{grid}")
    overrides += [
        f"graph.mesh_resolution={MESH[grid]}",
        "diagnostics.bench.batches=3",
        "diagnostics.bench.warmup_batches=1",
    ]
    result = run_capped([sys.executable, "-m", "anemo_like.cli.bench", *overrides], timeout_s=args.timeout_s)
    return {"row": "bench", "grid": grid} | result


def sharded_row(grid: str, args: argparse.Namespace) -> dict:
    flags = ["--grid", grid, "--mesh-res", str(MESH[grid]), *MODEL[:6], "--num-vars", "8", "--multistep", "2"]
    flags += ["--num-chunks", "4", "--processor-chunks", "2", "--ranks", "2,4", "--strategies", "edges"]
    flags += ["--warmup", "1", "--steps", str(args.steps)]
    result = run_capped([sys.executable, str(script("sharding.py")), *flags], timeout_s=2 * args.timeout_s)
    return {"row": "sharded", "grid": grid} | result


def measure(args: argparse.Namespace) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="anemo-scaling-") as tmp:
        folder = Path(tmp)
        for grid in args.grids:
            points = write_points(grid, folder)
            rows.append(print_json(model_row("ours", grid, points, args), args.out))
            if args.anchor:
                anchor = print_json(model_row("anchor", grid, points, args), args.out)
                rows.append(anchor)
                if args.planned_share and "step_memory_mib" in anchor:
                    budget_gb = args.planned_share * anchor["step_memory_mib"] / 1024
                    rows.append(print_json(model_row("ours planned", grid, points, args, budget_gb), args.out))
            rows.append(print_json(read_row(grid, folder, args), args.out))
        largest = args.grids[-1]
        rows.append(print_json(bound_row(largest, folder, args), args.out))
        if args.sharded:
            rows.append(print_json(sharded_row(largest, args), args.out))
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grids", nargs="+", choices=list(MESH), default=list(MESH))
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--no-anchor", dest="anchor", action="store_false")
    p.add_argument("--no-sharded", dest="sharded", action="store_false")
    p.add_argument("--anchor-python", type=Path, default=ANCHOR_PYTHON)
    p.add_argument("--anchor-memory-cap-gb", type=float, default=16.0, help="stop the anchor beyond this RSS")
    p.add_argument("--anchor-timeout-s", type=float, default=2400.0)
    p.add_argument(
        "--planned-share",
        type=float,
        default=0.3,
        help="also run ours with the memory plan for this share of the anchor's step memory (0: not)",
    )
    p.add_argument("--timeout-s", type=float, default=1800.0, help="for each of our runs")
    p.add_argument("--out", type=Path, default=None, help="also append the JSON lines to this file")
    p.add_argument("--from", dest="source", type=Path, default=None, help="read rows from a saved JSON-lines file")
    p.add_argument("--report", type=Path, default=None, help="write scaling.md and scaling.png into this folder")
    args = p.parse_args(argv)
    if args.anchor and args.source is None and not args.anchor_python.exists():
        p.error(f"{args.anchor_python} does not exist: run bash ../shared/bench/anchor/setup.sh, or --no-anchor")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.source is not None:
        rows = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
    else:
        rows = measure(args)
    if args.report is not None:
        from benchmarks.scaling.scaling_report import write_report

        write_report(rows, args.report)


if __name__ == "__main__":
    main()

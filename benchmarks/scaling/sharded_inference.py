#!/usr/bin/env python3
"""Per-rank peak memory of ``anemo-infer`` with the model sharded over P = 1, 2, 4 ranks. Prints ONE JSON line.

A synthetic dataset at the grid (``synthetic_dataset.py``) and a model of the reference size trained for one step
(``anemo-train``, the quickstart config with the size flags) give the checkpoint; then, for every P in
``--ranks``, P processes (gloo, one torch thread each, the torchrun variables) run one 5-day forecast with
``num_gpus_per_model=P``. Every rank logs three figures, and the JSON line holds each per rank and the ratio of
its largest value over the ranks to P = 1's:

* ``peak``: the process's peak resident memory (VmHWM), everything included: the total a node must hold per rank;
* ``above_runtime``: that peak less the resident memory after the imports (interpreter, torch and the other
  libraries, the same on every rank whatever P): the CPU counterpart of a GPU's ``max_memory_allocated``, which
  leaves out the CUDA context; weights, graph, inputs, activations and heap slack included;
* ``forecast``: what the forecasts added above the loaded model (the weights and graph are not in it).

Reference size (about 10 minutes on 2 cores):

    python benchmarks/scaling/sharded_inference.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import free_port, script

RANK_LINE = re.compile(
    r"rank (\d+): peak memory (\d+) MiB \(forecasts: \+(-?\d+) MiB above the loaded model; "
    r"run: \+(\d+) MiB above the (\d+) MiB after imports\)"
)
FIGURES = ("peak", "forecast", "above_runtime", "runtime")  # the order of RANK_LINE's MiB groups


def run(command: list[str], env: dict[str, str] | None = None) -> None:
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def size_overrides(args: argparse.Namespace) -> list[str]:
    return [f"graph.mesh_resolution={args.mesh_res}", f"model.num_channels={args.channels}",
            f"model.num_heads={args.heads}", f"model.processor.num_layers={args.layers}"]  # fmt: skip


def trained_checkpoint(folder: Path, grid: str, size: list[str]) -> tuple[Path, Path]:
    """(inference.pt of a one-step model of ``size``, its dataset: 60 dates from 2000-10-25)."""
    dataset = folder / f"synthetic-{grid}.zarr"
    run([sys.executable, str(script("synthetic_dataset.py")), "--grid", grid, "--dates", "60", "--out", str(dataset)])
    command = [sys.executable, "-m", "anemo_like.cli.train", "--config-name=quickstart", f"data.dataset={dataset}",
               *size, "training.max_steps=1", "dataloader.batch_size.train=1", "dataloader.limit_batches.val=1",
               "dataloader.batch_size.val=1", "diagnostics.plots=false", "diagnostics.progress_bar=false",
               "system.hardware.num_threads=1", f"system.paths.output={folder / 'run'}",
               f"system.paths.cache={folder / 'cache'}", f"hydra.run.dir={folder / 'run'}"]  # fmt: skip
    run(command)
    return folder / "run" / "inference.pt", dataset


def forecast(folder: Path, checkpoint: Path, dataset: Path, ranks: int, lead_time: str) -> dict[int, dict[str, int]]:
    """rank -> {figure: MiB} (``FIGURES``) of one forecast on ``ranks`` ranks."""
    port, processes = free_port(), []
    for rank in range(ranks):
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
        env["OMP_NUM_THREADS"] = "1"
        if ranks > 1:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))  # fmt: skip
        command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={checkpoint}", f"dataset={dataset}",
                   "dates=[2000-11-01T00]", f"lead_time={lead_time}", f"output={folder / f'forecast-{ranks}.nc'}",
                   "device=cpu", "num_threads=1", f"num_gpus_per_model={ranks}",
                   f"hydra.run.dir={folder / f'infer-{ranks}-{rank}'}"]  # fmt: skip
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))  # fmt: skip
    found = {}
    for process in processes:
        output, _ = process.communicate()
        if process.returncode != 0:
            raise SystemExit(output[-3000:])
        found.update({int(r): dict(zip(FIGURES, map(int, mib), strict=True)) for r, *mib in RANK_LINE.findall(output)})
    return found


def report(args: argparse.Namespace, per_rank: dict[int, dict[int, dict[str, int]]]) -> dict:
    """The JSON line: every figure per rank (``per_rank_<figure>_mib``: P -> [rank 0, ...]) and the ratio of its
    largest value over the ranks to the first P's (``<figure>_ratio``)."""
    first = args.ranks[0]
    line = {
        "benchmark": "sharded_inference",
        "grid": args.grid,
        "size": size_overrides(args),
        "lead_time": args.lead_time,
    }
    for figure in FIGURES:
        line[f"per_rank_{figure}_mib"] = {p: [ranks[r][figure] for r in sorted(ranks)] for p, ranks in per_rank.items()}
    for figure in FIGURES[:3]:
        largest = {p: max(figures[figure] for figures in ranks.values()) for p, ranks in per_rank.items()}
        line[f"{figure}_ratio"] = {p: round(largest[p] / largest[first], 3) for p in largest}
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="96x192", help="NLATxNLON of the synthetic dataset")
    parser.add_argument("--mesh-res", type=int, default=4)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--lead-time", default="5d")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        checkpoint, dataset = trained_checkpoint(folder, args.grid, size_overrides(args))
        per_rank = {p: forecast(folder, checkpoint, dataset, p, args.lead_time) for p in args.ranks}
    print(json.dumps(report(args, per_rank)))


if __name__ == "__main__":
    main()

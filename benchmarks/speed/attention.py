#!/usr/bin/env python3
"""Attention backends and compilation at the reference size: prints ONE JSON line.

Part 1, per backend that can run on this machine (the others are listed with the reason): forward + backward of
one attention call at the size of a reference processor layer.
- graph attention (``model.graph_attention_backend``): 2,562 mesh nodes, 20,400 multi-scale edges, 16 heads of
  16 channels, 11 edge features;
- sliding-window attention (``model.processor.attention_implementation``): the same nodes and heads, window 512.

Part 2: forward + backward of the whole model at the reference size, eager and with ``--compile`` classes
compiled (``model.compile``), compile time reported apart; eager and compiled steps alternate, and the speed-up
is the median of the per-pair ratios (robust to a shared machine's load changing during the run).

Time: median wall and CPU seconds of ``--steps`` steps after ``--warmup``. Memory: on CUDA the peak allocated
above the start of the step (``torch.cuda.max_memory_allocated``); on CPU the peak of live tensors created in the
step (``LiveTensorTracker``, no allocator effects). The same fields are printed on both.

    python benchmarks/speed/attention.py                           # CPU here, or unchanged on a CUDA machine
    python benchmarks/speed/attention.py --processor transformer \
        --compile anemo_like.models.sliding_window.SlidingWindowTransformerLayer
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from anemo_like.config.schema import CompileEntry, ModelConfig
from anemo_like.diagnostics.live_tensors import LiveTensorTracker
from anemo_like.graphs import build_graph
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.ops import window_attention as window
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import GRAPH_ATTENTION_BACKENDS
from anemo_like.models.ops.triton_graph_attention import triton_unavailable_reason
from anemo_like.runtime.compile import compile_modules
from benchmarks.script_runs import cpu_s
from benchmarks.speed.step_measures import grid_coordinates


def _timed(step: Callable[[], None], device: torch.device) -> tuple[float, float]:
    """Wall and CPU seconds of one call of ``step``."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall_start, cpu_start = time.perf_counter(), cpu_s()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - wall_start, cpu_s() - cpu_start


def peak_mib(step: Callable[[], None], device: torch.device) -> float:
    """Peak memory of one call of ``step`` in MiB (see the module docstring)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        step()
        return (torch.cuda.max_memory_allocated() - start) / 2**20
    with LiveTensorTracker() as tracker:
        step()
    return tracker.peak_mib


def measure(step: Callable[[], None], device: torch.device, *, warmup: int, steps: int) -> dict:
    """Median wall / CPU seconds of ``step`` and its peak memory in MiB."""
    for _ in range(warmup):
        step()
    wall, cpu = zip(*(_timed(step, device) for _ in range(steps)), strict=True)
    return {
        "wall_s": round(statistics.median(wall), 4),
        "cpu_s": round(statistics.median(cpu), 4),
        "peak_mib": round(peak_mib(step, device), 1),
    }


def attention_inputs(graph, args, device, dtype) -> dict:
    """Random q, k, v, edge features and embedding of one processor layer, and its destination-sorted edges."""
    generator = torch.Generator().manual_seed(0)
    nodes, heads, width = graph["hidden"].num_nodes, args.heads, args.channels // args.heads
    edges = graph[("hidden", "to", "hidden")]

    def leaf(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale).to(device, dtype).requires_grad_()

    attr_dim = edges.edge_attr.shape[1] + 8
    return {
        "q": leaf(1, nodes, heads, width),
        "k": leaf(1, nodes, heads, width),
        "v": leaf(1, nodes, heads, width),
        "edge_attr": leaf(edges.edge_index.shape[1], attr_dim),
        "weight": leaf(heads * width, attr_dim, scale=attr_dim**-0.5),
        "bias": leaf(heads * width),
        "edges": SortedEdges(edges.edge_index.to(device), nodes),
    }


def backend_results(graph, args, device: torch.device, dtype: torch.dtype) -> list[dict]:
    inputs = attention_inputs(graph, args, device, dtype)
    tensors = [inputs[name] for name in ("q", "k", "v", "edge_attr", "weight", "bias")]
    results = []
    for name in sorted(GRAPH_ATTENTION_BACKENDS):
        reason = triton_unavailable_reason(device) if name == "triton" else None
        row = {"attention": "graph", "backend": name}
        if reason is not None:
            results.append({**row, "skipped": reason})
            continue

        def graph_step(name: str = name) -> None:
            out = GRAPH_ATTENTION_BACKENDS[name](*tensors, inputs["edges"])
            out.backward(torch.ones_like(out))

        results.append({**row, **measure(graph_step, device, warmup=args.warmup, steps=args.steps)})
    q, k, v = (inputs[n].detach().transpose(1, 2).contiguous().requires_grad_() for n in ("q", "k", "v"))
    for name in window.BACKENDS:
        flash = window.import_flash_attention()
        reason = window.flash_unavailable_reason(device, dtype, flash) if name == "flash_attention" else None
        row = {"attention": "sliding_window", "backend": name, "window": args.window}
        if reason is not None:
            results.append({**row, "skipped": reason})
            continue

        def window_step(name: str = name) -> None:
            window.window_attention(q, k, v, window=args.window, backend=name).sum().backward()

        results.append({**row, **measure(window_step, device, warmup=args.warmup, steps=args.steps)})
    return results


def model_results(graph, args, device: torch.device) -> list[dict]:
    """The whole model eager and with the ``--compile`` classes compiled: their steps alternate (the order swapped
    every pair), so both see the same machine load; ``speedup_vs_eager`` is the median of the pairs' ratios."""
    variables = list(range(8))
    layout = VariableLayout(
        num_input=8, num_output=8, prognostic_input=variables, prognostic_output=variables, relu_floor={}
    )
    grid = graph["data"].num_nodes
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2, grid, 8, generator=generator).to(device)
    y = torch.randn(1, grid, 8, generator=generator).to(device)
    rows, steps = [], []
    for compiled in (False, True):
        config = ModelConfig(
            num_channels=args.channels,
            num_heads=args.heads,
            encoder={"num_chunks": args.mapper_chunks},
            decoder={"num_chunks": args.mapper_chunks},
            processor={
                "type": args.processor,
                "num_layers": args.layers,
                "num_chunks": min(4, args.layers),
                "window_size": args.window,
            },
        )
        torch.manual_seed(0)
        model = ForecastModel(config=config, graph=graph, layout=layout, multistep=2).to(device)
        entries = [CompileEntry(module=name, options=args.compile_options) for name in args.compile] if compiled else []
        if entries:
            compile_modules(model, entries, recompile_limit=16)

        def model_step(model: ForecastModel = model) -> None:
            torch.nn.functional.mse_loss(model(x), y).backward()
            model.zero_grad(set_to_none=True)

        first_wall, _ = _timed(model_step, device)  # compiles, when compiling
        for _ in range(args.warmup):
            model_step()
        rows.append(
            {"model": args.processor, "compile": [e.module for e in entries], "first_step_s": round(first_wall, 2)}
        )
        steps.append(model_step)
    times: list[list[tuple[float, float]]] = [[], []]
    for i in range(args.steps):
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            times[which].append(_timed(steps[which], device))
    for row, step, timed in zip(rows, steps, times, strict=True):
        wall, cpu = zip(*timed, strict=True)
        row |= {"wall_s": round(statistics.median(wall), 4), "cpu_s": round(statistics.median(cpu), 4)}
        row["peak_mib"] = round(peak_mib(step, device), 1)
    use = 1 if device.type == "cpu" else 0  # CPU seconds on CPU, wall seconds on a GPU
    ratios = [e[use] / c[use] for e, c in zip(*times, strict=True)]
    rows[1]["speedup_vs_eager"] = round(statistics.median(ratios), 3)
    rows[1]["speedup_vs_eager_pairs"] = [round(r, 3) for r in ratios]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="96x192")
    p.add_argument("--mesh-res", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--mapper-chunks", type=int, default=4)
    p.add_argument("--processor", choices=["graphtransformer", "transformer"], default="graphtransformer")
    p.add_argument("--compile", nargs="*", default=["anemo_like.models.mlp.MLP"], help="classes for model.compile")
    p.add_argument("--compile-options", type=json.loads, default={}, help="JSON, e.g. '{\"dynamic\": false}'")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="part 1 only")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip-model", action="store_true", help="part 1 only")
    p.add_argument("--skip-backends", action="store_true", help="part 2 only")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    _, lat, lon = grid_coordinates(args.grid)
    graph = build_graph(lat, lon, mesh_resolution=args.mesh_res, processor_edges=True)
    report = {
        "benchmark": "attention",
        "device": str(device),
        "memory_measure": "cuda_max_allocated" if device.type == "cuda" else "live_tensors",
        "threads": torch.get_num_threads(),
        "args": {k: v for k, v in vars(args).items() if k != "compile_options"}
        | {"compile_options": args.compile_options},
        "backends": [] if args.skip_backends else backend_results(graph, args, device, getattr(torch, args.dtype)),
        "model": [] if args.skip_model else model_results(graph, args, device),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()

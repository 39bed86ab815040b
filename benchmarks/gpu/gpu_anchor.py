#!/usr/bin/env python3
"""GPU step time and memory of the anchor (ECMWF anemoi-models 0.19.0) at cases S, R, T and O96.

The GPU machine has torch, triton and torch-geometric but neither network access nor anemoi-graphs (which would drag
in anemoi-datasets, netCDF4, eccodes ...). So the work is split in three modes:

    # here, once (any Python with pip; needs network): the wheels anemoi-models needs at model-construction time
    python benchmarks/gpu/gpu_anchor.py --download-wheels .gpu-wheels/anchor
    # here, once (the CPU anchor venv, which has anemoi-graphs): the anchor's graphs as plain tensors
    /tmp/anchor/venv/bin/python benchmarks/gpu/gpu_anchor.py --build-graphs .gpu-wheels/anchor_graphs
    # there (repo root, GPU machine, Python 3.12): install the wheels, then one JSON line per run
    pip install --no-index --no-deps --target /tmp/site .gpu-wheels/anchor/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu/gpu_anchor.py --case R --precision bf16-mixed --backend triton

The graphs are built with anemoi-graphs following ``../shared/bench/anchor/run.py`` (data nodes on a cell-centred
lat/lon grid, TriNodes hidden mesh, CutOffEdges 0.6 encoder, MultiScaleEdges processor, KNN-3 decoder, EdgeLength +
EdgeDirection ``unit-std`` attributes) and stored as a dict of tensors (no HeteroData pickle, so the torch-geometric
version does not matter). The default mode rebuilds a ``HeteroData`` from them, instantiates
``anemoi.models.models.AnemoiModelEncProcDec`` with the config of run.py (anemoi-training's
``model/graphtransformer.yaml`` / ``transformer.yaml``) and times forward + backward of an MSE loss on random inputs,
batch 1, no optimizer step. On CUDA each phase is timed with CUDA events; memory is
``torch.cuda.max_memory_allocated`` over warm-up and timed steps. ``--device cpu`` is a dry run.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import platform
import resource
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.gpu.gpu_anchor_model import attention_backends, build_model
from benchmarks.gpu.gpu_anchor_setup import CASES, build_graphs, download_wheels, load_graph, summary_from_tensors
from benchmarks.script_runs import REPO, print_json
from benchmarks.speed.step_measures import profile_summary


# ----------------------------------------------------------------------------------------------------------------
# default mode: model + timed steps (no anemoi-graphs needed)
# ----------------------------------------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    """Median rounded to 10 µs."""
    return round(statistics.median(values), 5)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Build graph + model, time warm-up + steps, return the result dict."""
    import torch
    import torch_geometric

    t_import0 = time.perf_counter()
    import anemoi.models
    import anemoi.models.models

    t_import = time.perf_counter() - t_import0
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)

    graph_path = Path(args.graph or Path(args.graphs_dir) / f"{CASES[args.case].get('graph', args.case)}.pt")
    graph, raw = load_graph(graph_path)
    if raw["recipe"]["processor_edges"] != (args.processor == "graphtransformer"):
        raise SystemExit(f"{graph_path} was built for the other processor kind than --processor {args.processor}")

    t0 = time.perf_counter()
    model, data_indices = build_model(args, graph)
    infer = args.mode == "infer"
    model.to(device).train(not infer)
    t_model = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())

    nv_in = len(data_indices["data"].model.input)
    nv_out = len(data_indices["data"].model.output)
    grid = int(raw["nodes"]["data"]["x"].shape[0])
    gen = torch.Generator().manual_seed(args.seed)
    # model input layout: (batch, time, ensemble, grid, vars)
    x = {"data": torch.randn(args.batch, args.multistep, 1, grid, nv_in, generator=gen).to(device)}
    y = torch.randn(args.batch, args.n_step_output, 1, grid, nv_out, generator=gen).to(device)
    autocast_dtype = torch.bfloat16 if args.precision == "bf16-mixed" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if args.optim == "adamw" and not infer else None

    def step() -> tuple[float, float, float]:
        """One forward + backward (forward only without gradients in ``--mode infer``); returns (forward s,
        backward s, loss)."""
        if cuda:
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            events[0].record()
        else:
            ta = time.perf_counter()
        with (
            torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None),
            torch.set_grad_enabled(not infer),
        ):
            out = model(x)["data"]
            loss = torch.nn.functional.mse_loss(out.float(), y)
        if cuda:
            events[1].record()
        else:
            tb = time.perf_counter()
        if not infer:
            loss.backward()
        if optimizer is not None:
            optimizer.step()
        if cuda:
            events[2].record()
            events[2].synchronize()
            fwd, bwd = events[0].elapsed_time(events[1]) / 1e3, events[1].elapsed_time(events[2]) / 1e3
        else:
            tc = time.perf_counter()
            fwd, bwd = tb - ta, tc - tb
        model.zero_grad(set_to_none=True)
        return fwd, bwd, float(loss.detach())

    if cuda:
        torch.cuda.synchronize()
        mem_before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t_warm0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    t_warm = time.perf_counter() - t_warm0

    fwd, bwd, tot, wall, losses = [], [], [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        f, b, loss = step()
        wall.append(time.perf_counter() - t0)
        fwd.append(f)
        bwd.append(b)
        tot.append(f + b)
        losses.append(loss)

    profiled = profile_summary(torch, step, args.profile_steps) if args.profile_steps else None
    backends = attention_backends(model)
    result: dict[str, Any] = {
        "profile": profiled,
        "system": "anemoi",
        "case": args.case,
        "precision": args.precision,
        "backend": ",".join(backends["graph_attention_backend"]),  # what the blocks use (triton falls back to pyg)
        "backend_requested": args.backend,
        "step_s_median": median(tot),
        "fwd_s_median": median(fwd),
        "bwd_s_median": median(bwd),
        "step_wall_s_median": median(wall),
        "step_s_min": round(min(tot), 5),
        "step_s_max": round(max(tot), 5),
    }
    if cuda:
        result["peak_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        result["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
        result["mem_before_steps_mib"] = round(mem_before / 2**20, 1)
        result["peak_mem_steps_delta_mib"] = round((torch.cuda.max_memory_allocated() - mem_before) / 2**20, 1)
    else:
        result["peak_mem_mib"] = None
        result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    result.update(
        {
            "params": n_params,
            "graph": summary_from_tensors(raw),
            "graph_recipe": raw["recipe"],
            "attention": backends,
            "loss_first": losses[0],
            "loss_finite": all(math.isfinite(v) for v in losses),
            "time_import_s": round(t_import, 3),
            "time_model_build_s": round(t_model, 3),
            "time_warmup_total_s": round(t_warm, 3),
            "step_s_all": [round(t, 5) for t in tot],
            "args": {
                k: v
                for k, v in vars(args).items()
                if k not in {"download_wheels", "build_graphs", "cases", "graphs_dir", "out", "verbose"}
            },
            "versions": versions(torch, torch_geometric, anemoi.models.__version__),
            "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
            "env": {
                k: v
                for k, v in sorted(os.environ.items())
                if k.startswith(("ANEMOI_", "PYTORCH_", "TORCH_", "CUDA_", "TRITON_"))
            },
        }
    )
    return result


def versions(torch: Any, torch_geometric: Any, anemoi_models: str) -> dict[str, str | None]:
    """Versions of the stack that produced the numbers."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "anemoi-models": anemoi_models,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "torch_geometric": torch_geometric.__version__,
        "python": platform.python_version(),
    }


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------
def get_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse arguments; model sizes default to the chosen case's."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = p.add_argument_group("other modes (run here, not on the GPU)")
    modes.add_argument("--download-wheels", metavar="DIR", help="download the wheels of gpu_anchor_wheels.txt to DIR")
    modes.add_argument("--build-graphs", metavar="DIR", help="build the cases' graphs with anemoi-graphs into DIR")
    modes.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES), help="for --build-graphs")

    g = p.add_argument_group("benchmark")
    g.add_argument("--case", choices=sorted(CASES), default="R")
    g.add_argument("--graphs-dir", default=str(REPO / ".gpu-wheels" / "anchor_graphs"))
    g.add_argument("--graph", default="", help="graph file (default: GRAPHS_DIR/CASE.pt)")
    g.add_argument("--device", default="cuda")
    g.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32")
    g.add_argument("--mode", choices=["train", "infer"], default="train", help="infer: eval-mode forward, no gradients")
    g.add_argument("--backend", choices=["triton", "pyg"], default="triton", help="GraphTransformer attention backend")
    g.add_argument("--tf32", action="store_true", help="allow TF32 matmuls in fp32 (default off: strict fp32)")
    g.add_argument("--warmup", type=int, default=5)
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps (torch.profiler)")
    g.add_argument("--label", default="")
    g.add_argument("--out", default="", help="also append the JSON line to this file")
    g.add_argument("--verbose", action="store_true", help="anemoi INFO logging and warnings on stderr")

    m = p.add_argument_group("model (defaults: the case's)")
    m.add_argument("--channels", type=int, default=None)
    m.add_argument("--layers", type=int, default=None)
    m.add_argument("--heads", type=int, default=16)
    m.add_argument("--num-vars", type=int, default=None, help="default: the case's, else 8")
    m.add_argument("--multistep", type=int, default=2)
    m.add_argument("--n-step-output", type=int, default=1)
    m.add_argument("--mlp-hidden-ratio", type=float, default=4.0)
    m.add_argument("--num-chunks-mapper", type=int, default=4)
    m.add_argument("--num-chunks-processor", type=int, default=None, help="default: the case's, else 4")
    m.add_argument("--optim", choices=["none", "adamw"], default=None, help="default: the case's, else none")
    m.add_argument("--no-grad-checkpointing", action="store_true")
    m.add_argument(
        "--attention-implementation",
        default="scaled_dot_product_attention",
        help="TransformerProcessor attention (case T; anemoi's default flash_attention needs flash-attn)",
    )
    m.add_argument("--window-size", type=int, default=512)
    m.add_argument("--node-trainable", type=int, default=8)
    m.add_argument("--edge-trainable", type=int, default=8)
    a = p.parse_args(argv)

    spec = CASES[a.case]
    a.processor = spec["processor"]
    a.channels = a.channels or spec["channels"]
    a.layers = a.layers or spec["layers"]
    a.num_vars = a.num_vars or spec.get("num_vars", 8)
    a.num_chunks_processor = a.num_chunks_processor or spec.get("num_chunks_processor", 4)
    a.optim = a.optim or spec.get("optim", "none")
    if a.layers % a.num_chunks_processor:
        p.error(f"--num-chunks-processor ({a.num_chunks_processor}) must divide --layers ({a.layers})")
    if a.channels % a.heads:
        p.error(f"--channels ({a.channels}) must be divisible by --heads ({a.heads})")
    if a.steps < 1:
        p.error("--steps must be >= 1")
    return a


def main(argv: list[str] | None = None) -> None:
    """Dispatch to --download-wheels, --build-graphs or the benchmark."""
    args = get_args(argv)
    if args.download_wheels:
        download_wheels(Path(args.download_wheels))
        return
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        warnings.filterwarnings("ignore")
    if args.build_graphs:
        build_graphs(Path(args.build_graphs), args.cases)
        return
    result = run_benchmark(args)
    print_json(result, args.out)


if __name__ == "__main__":
    main()

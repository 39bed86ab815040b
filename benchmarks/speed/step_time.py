#!/usr/bin/env python3
"""Forward+backward step time and memory of the anemo_like model at a given size: prints ONE JSON line.

Flags and JSON field names follow the anchor harness (../shared/bench/anchor/run.py), so the two can be run
side by side and tabulated together by its summarize.py. Example (case R):

    python benchmarks/speed/step_time.py --grid 96x192 --mesh-res 4 --channels 256 --layers 8 --heads 16 \
        --num-vars 8 --multistep 2 --threads 1 --steps 5

With ``--device cuda`` the model and data live on the GPU: forward and backward are timed by CUDA events (the
step's GPU time; ``step_s_*``, ``fwd_s_median``, ``bwd_s_median``) and ``peak_mem_mib`` is
``torch.cuda.max_memory_allocated`` over the timed steps (weights, inputs and activations: everything allocated),
``peak_mem_steps_delta_mib`` the same above what was allocated just before them. The CPU fields stay (host RSS).
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import cpu_s, print_json
from benchmarks.speed.step_args import parse_args
from benchmarks.speed.step_measures import (
    CudaClock,
    WallClock,
    calibrate_matmul,
    count_step_flops,
    count_step_ops,
    cuda_memory_before_steps,
    cuda_memory_of_steps,
    graph_summary,
    grid_coordinates,
    machine_load,
    profile_summary,
    tensor_peaks,
    use_triton_stand_in,
)

HARNESS_VERSION = 1
COMPONENTS = ("encoder", "processor", "decoder")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.triton_stand_in:
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: the kernels' device check passes on CPU
    start_import = time.perf_counter()
    import numpy as np
    import torch
    import torch_geometric

    import anemo_like
    from anemo_like.config.schema import ModelConfig
    from anemo_like.graphs import build_graph
    from anemo_like.models import ForecastModel, VariableLayout
    from anemo_like.runtime.heap_release import set_heap_release
    from anemo_like.runtime.precision import precision_plan
    from anemo_like.runtime.process_memory import current_rss_mib, peak_rss_mib, reset_peak_rss

    time_import = time.perf_counter() - start_import
    if args.triton_stand_in:
        use_triton_stand_in(torch)
    rss_after_import = current_rss_mib()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    heap_release = set_heap_release(args.release_cpu_heap_mib or None)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    peak_reset = reset_peak_rss()
    start = time.perf_counter()
    kind, lat, lon = grid_coordinates(args.grid)
    graph = build_graph(
        lat,
        lon,
        mesh_resolution=args.mesh_res,
        cutoff_factor=args.cutoff_factor,
        knn=args.knn,
        processor_edges=args.processor == "graphtransformer",
    )
    time_graph = time.perf_counter() - start
    peak_graph = peak_rss_mib()

    reset_peak_rss()
    start = time.perf_counter()
    planned = args.memory_budget_gb is not None
    mapper_chunks, processor_chunks = (
        ("auto", "auto") if planned else (args.num_chunks_mapper, args.num_chunks_processor)
    )
    recompute = "auto" if planned else not args.no_grad_checkpointing
    model_config = ModelConfig(
        num_channels=args.channels,
        num_heads=args.heads,
        mlp_hidden_ratio=args.mlp_hidden_ratio,
        trainable={"nodes": args.node_trainable, "edges": args.edge_trainable},
        graph_attention_backend=args.graph_attention_backend,
        block_elements=args.block_elements if args.block_elements == "auto" else int(args.block_elements),
        encoder={"num_chunks": mapper_chunks, "gradient_checkpointing": recompute},
        decoder={"num_chunks": mapper_chunks, "gradient_checkpointing": recompute},
        processor={
            "type": args.processor,
            "num_layers": args.layers,
            "num_chunks": processor_chunks,
            "gradient_checkpointing": recompute,
            "window_size": args.window_size,
        },
    )
    prognostic = list(range(args.num_vars))
    layout = VariableLayout(
        num_input=args.num_vars,
        num_output=args.num_vars,
        prognostic_input=prognostic,
        prognostic_output=prognostic,
        relu_floor={0: 0.0},  # like the anchor's ReLU bounding of its first variable
    )
    memory_plan = None
    if planned:
        from anemo_like.runtime.memory_plan import count_parameters, resolve_auto_settings

        num_parameters = count_parameters(model_config, graph, layout, args.multistep)
        budget = int(args.memory_budget_gb * 2**30)
        model_config, plan = resolve_auto_settings(
            model_config,
            graph=graph,
            batch_size=args.batch,
            num_parameters=num_parameters,
            budget_bytes=budget,
            device=device,
        )
        memory_plan = {
            "budget_mib": round(budget / 2**20, 1),
            "predicted_peak_mib": round(plan.peak_bytes / 2**20, 1),
            "fits": plan.fits,
            "settings": plan.describe(),
        }
    model = ForecastModel(config=model_config, graph=graph, layout=layout, multistep=args.multistep)
    model.train(args.mode == "train")
    precision = precision_plan(args.precision, device)
    model.to(device, precision.param_dtype)
    time_model = time.perf_counter() - start
    peak_model = peak_rss_mib()
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    grid = graph["data"].num_nodes
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randn(args.batch, args.multistep, grid, args.num_vars, generator=generator)
    x = x.to(device, precision.param_dtype)
    y = torch.randn(args.batch, grid, args.num_vars, generator=generator).to(device)
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=1e-4, fused=args.cuda_graphs or None)
        if args.optim == "adamw"
        else None
    )

    def clock() -> WallClock | CudaClock:
        return CudaClock(torch) if device.type == "cuda" else WallClock()

    def eager_step(read_loss: bool = True) -> tuple[float, float, float, float]:
        cpu_start, start = cpu_s(), clock()
        with torch.set_grad_enabled(args.mode == "train"), precision.training_weights(model):  # as the trainer
            with precision.autocast():
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            mid = clock()
            if args.mode == "train":
                (loss if precision.scaler is None else precision.scaler.scale(loss)).backward()
        if optimizer is not None:
            optimizer.step()
        end = clock()
        loss_value = float(loss.detach()) if read_loss else math.nan  # waits for the device
        cpu_end = cpu_s()
        model.zero_grad(set_to_none=True)
        return mid.seconds_since(start), end.seconds_since(mid), cpu_end - cpu_start, loss_value

    def update(batch: torch.Tensor) -> torch.Tensor:
        """Forward, backward and optimiser step without reading anything back: what a CUDA graph replays."""
        with torch.set_grad_enabled(args.mode == "train"), precision.training_weights(model):
            with precision.autocast():
                loss = torch.nn.functional.mse_loss(model(batch).float(), y)
            if args.mode == "train":
                loss.backward()
        if optimizer is not None:
            optimizer.step()
        return loss.detach()

    replays = []  # the captured step, made by the first call of graph_step

    def graph_step(read_loss: bool = True) -> tuple[float, float, float, float]:
        """``update`` replayed as a CUDA graph (captured on the first call, after an eager pass): its whole time."""
        if not replays:
            from anemo_like.inference.captured_forward import CapturedForward
            from anemo_like.training.cuda_graphs import CapturedStep

            replays.append(CapturedStep(update, x, optimizer) if args.mode == "train" else CapturedForward(update))
        cpu_start, start = cpu_s(), clock()
        loss = replays[0](x)
        end = clock()
        loss_value = float(loss) if read_loss else math.nan
        return end.seconds_since(start), 0.0, cpu_s() - cpu_start, loss_value

    step = graph_step if args.cuda_graphs else eager_step  # the timed loops, counters and profiles
    calib_before = calibrate_matmul(torch)
    load_before = machine_load()
    rss_before_steps = current_rss_mib()
    reset_peak_rss()
    start = time.perf_counter()
    for _ in range(args.warmup):
        step()
    time_warmup = time.perf_counter() - start
    cuda_before_steps = cuda_memory_before_steps(torch, device)
    forward, backward, total, cpu, losses = [], [], [], [], []
    for _ in range(args.steps):
        f, b, c, loss = step()
        forward.append(f)
        backward.append(b)
        total.append(f + b)
        cpu.append(c)
        losses.append(loss)
    peak_steps = peak_rss_mib()
    cuda_memory = cuda_memory_of_steps(torch, device, cuda_before_steps)
    live_tensor_peak, tensor_peak = tensor_peaks(torch, step, model, optimizer) if args.live_tensors else (None, None)
    step_flops = count_step_flops(torch, step) if args.count_flops else None
    ops = count_step_ops(lambda: step(read_loss=False)) if args.count_ops else None
    profiled = profile_summary(torch, step, args.profile_steps) if args.profile_steps else None
    load_after = machine_load()
    calib_after = calibrate_matmul(torch)

    def mib(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    result = {
        "system": "anemo_like",
        "harness_version": HARNESS_VERSION,
        "label": args.label,
        "versions": {
            "anemo_like": anemo_like.__version__,
            "torch": torch.__version__,
            "torch_geometric": torch_geometric.__version__,
            "python": platform.python_version(),
        },
        "machine": {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
        },
        "env": {
            k: v
            for k, v in sorted(os.environ.items())
            if k.startswith(("MALLOC_", "OMP_", "MKL_", "KMP_", "LD_PRELOAD", "ANEMOI_", "PYTORCH_", "TORCH_"))
        },
        "args": {
            "grid": args.grid,
            "grid_kind": kind,
            "mesh_res": args.mesh_res,
            "cutoff_factor": args.cutoff_factor,
            "knn": args.knn,
            "processor": args.processor,
            "channels": args.channels,
            "heads": args.heads,
            "layers": args.layers,
            "mlp_hidden_ratio": args.mlp_hidden_ratio,
            "num_vars": args.num_vars,
            "multistep": args.multistep,
            "precision": args.precision,
            "num_chunks_mapper": model_config.encoder.num_chunks,
            "num_chunks_decoder": model_config.decoder.num_chunks,
            "num_chunks_processor": model_config.processor.num_chunks,
            "grad_checkpointing": {n: getattr(model_config, n).gradient_checkpointing for n in COMPONENTS},
            "memory_budget_gb": args.memory_budget_gb,
            "batch": args.batch,
            "warmup": args.warmup,
            "steps": args.steps,
            "optim": args.optim,
            "seed": args.seed,
            "window_size": args.window_size if args.processor == "transformer" else None,
            "graph_attention_backend": args.graph_attention_backend,
            "block_elements": args.block_elements,
            "triton_stand_in": args.triton_stand_in,
            "mode": args.mode,
            "cuda_graphs": args.cuda_graphs,
            "device": args.device,
            "release_cpu_heap_mib": args.release_cpu_heap_mib if heap_release else None,
        },
        "graph": graph_summary(graph),
        "params": n_params,
        "params_trainable": n_trainable,
        "time_import_s": round(time_import, 3),
        "time_graph_build_s": round(time_graph, 3),
        "time_model_build_s": round(time_model, 3),
        "time_warmup_total_s": round(time_warmup, 3),
        "step_s_median": round(statistics.median(total), 4),
        "step_s_min": round(min(total), 4),
        "step_s_max": round(max(total), 4),
        "fwd_s_median": round(statistics.median(forward), 4),
        "bwd_s_median": round(statistics.median(backward), 4),
        "step_s_all": [round(t, 4) for t in total],
        "step_cpu_s_median": round(statistics.median(cpu), 4),
        "machine_load_before": load_before,
        "machine_load_after": load_after,
        "calib_matmul_gflops_before": round(calib_before, 1),
        "calib_matmul_gflops_after": round(calib_after, 1),
        "loss_first": losses[0],
        "loss_finite": all(math.isfinite(v) for v in losses),
        "peak_rss_mib": mib(max(v for v in (peak_graph, peak_model, peak_steps) if v is not None)),
        "peak_rss_graph_build_mib": mib(peak_graph),
        "peak_rss_model_build_mib": mib(peak_model),
        "peak_rss_steps_mib": mib(peak_steps),
        "rss_after_import_mib": mib(rss_after_import),
        "rss_before_steps_mib": mib(rss_before_steps),
        "peak_rss_steps_delta_mib": mib(peak_steps - rss_before_steps),
        "live_tensor_peak_mib": mib(live_tensor_peak),
        "tensor_peak_mib": mib(tensor_peak),
        "memory_plan": memory_plan,
        "step_gflop": None if step_flops is None else round(step_flops / 1e9, 4),
        "ops": ops,
        "profile": profiled,
        "peak_reset_per_phase": peak_reset,
        "memory_source": "VmHWM from /proc/self/status, reset per phase via /proc/self/clear_refs",
        **cuda_memory,
    }
    return print_json(result, args.out)


if __name__ == "__main__":
    main()

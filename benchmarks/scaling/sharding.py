#!/usr/bin/env python3
"""Model sharding on CPU: per-rank peak memory, step time and bytes communicated per step, for P ranks per model
and each strategy. Prints ONE JSON line.

For every P in --ranks and every strategy in --strategies, P processes (gloo, one torch thread each) build the
same model, shard it (``system.hardware.num_gpus_per_model = P``) and time forward + backward + gradient
reduction of an MSE loss on random inputs. Bytes are counted from the calls, not estimated from the model: every
``all_to_all_single`` and ``all_reduce`` a rank issues during the timed steps is intercepted; an all-to-all
counts the rows it sends to other ranks, an all-reduce the ``2 (P - 1) / P`` of its tensor that a ring
all-reduce sends. They are summed into activations (sharding collectives) and gradients (the reduction after
backward). Memory is the rise of VmHWM over the RSS before the first (warm-up) step, with the CPU heap released
at chunk boundaries as in training; one more step under the live-tensor tracker gives the peak of tensors alive
at once (no allocator effects). CPU seconds are per rank (several ranks share the 2 cores here, so wall times of
P > 2 are inflated). Reference size (about 4 minutes on 2 cores):

    python benchmarks/scaling/sharding.py --grid 96x192 --mesh-res 4 --channels 256 --layers 8 --heads 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from anemo_like.config.schema import ModelConfig
from anemo_like.diagnostics.live_tensors import LiveTensorTracker
from anemo_like.distributed.data_parallel import GradientBuckets
from anemo_like.distributed.groups import build_process_groups
from anemo_like.distributed.parallelize import shard_model
from anemo_like.graphs import build_graph
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.runtime.heap_release import set_heap_release
from anemo_like.runtime.process_memory import current_rss_mib, peak_rss_mib, reset_peak_rss
from benchmarks.script_runs import cpu_s, free_port
from benchmarks.speed.step_measures import grid_coordinates


class ByteCounter:
    """Wraps torch.distributed's all_to_all_single and all_reduce; counts bytes sent to other ranks."""

    def __init__(self) -> None:
        self.bytes = {"activations": 0, "gradients": 0}
        self.kind: str | None = None
        self._all_to_all, self._all_reduce = dist.all_to_all_single, dist.all_reduce

    def install(self) -> None:
        dist.all_to_all_single, dist.all_reduce = self._count_all_to_all, self._count_all_reduce

    def _count_all_to_all(self, output, input, output_split_sizes=None, input_split_sizes=None, group=None, **kw):
        if self.kind is not None:
            rows = input.shape[0]
            row_bytes = input.numel() // max(rows, 1) * input.element_size()
            splits = input_split_sizes or [rows // dist.get_world_size(group)] * dist.get_world_size(group)
            own = splits[dist.get_rank(group)]
            self.bytes["activations"] += (rows - own) * row_bytes
        return self._all_to_all(output, input, output_split_sizes, input_split_sizes, group=group, **kw)

    def _count_all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, **kw):
        if self.kind is not None:
            size = dist.get_world_size(group)
            # ring all-reduce: each rank sends 2 (P - 1) / P of the tensor
            self.bytes[self.kind] += int(2 * (size - 1) / size * tensor.numel() * tensor.element_size())
        return self._all_reduce(tensor, op=op, group=group, **kw)


def worker(rank: int, ranks: int, port: int, args: argparse.Namespace, graph_path: str, strategy: str, out: str):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
    counter = ByteCounter()
    counter.install()
    graph = torch.load(graph_path, weights_only=False)
    config = ModelConfig(
        num_channels=args.channels,
        num_heads=args.heads,
        encoder={"num_chunks": args.num_chunks, "shard_strategy": strategy},
        decoder={"num_chunks": args.num_chunks, "shard_strategy": strategy},
        processor={"num_layers": args.layers, "num_chunks": args.processor_chunks, "shard_strategy": strategy},
    )
    variables = list(range(args.num_vars))
    layout = VariableLayout(
        num_input=args.num_vars, num_output=args.num_vars, prognostic_input=variables, prognostic_output=variables,
        relu_floor={},
    )  # fmt: skip
    torch.manual_seed(0)
    model = ForecastModel(config=config, graph=graph, layout=layout, multistep=args.multistep)
    shard_model(model, build_process_groups(ranks, rank, ranks))  # same seed on every rank: no broadcast needed
    generator = torch.Generator().manual_seed(1)
    grid = graph["data"].num_nodes
    x = torch.randn(1, args.multistep, grid, args.num_vars, generator=generator)
    y = torch.randn(1, grid, args.num_vars, generator=generator)

    set_heap_release(32.0)  # as training does on CPU (system.hardware.release_cpu_heap_mib)
    baseline = current_rss_mib()  # before the gradients: one process allocates them in backward
    reset_peak_rss()
    gradients = GradientBuckets(model.parameters(), bucket_cap_mb=25.0) if ranks > 1 else None
    bucket_mib = sum(b.numel() * b.element_size() for b in gradients.buffers) / 2**20 if gradients else 0.0

    def step() -> None:  # as the trainer does
        if gradients is None:
            model.zero_grad(set_to_none=True)
        else:
            gradients.zero()
        counter.kind = "activations"
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        counter.kind = "gradients"
        if gradients is not None:
            gradients.average()
        counter.kind = None

    for _ in range(args.warmup):
        step()
    counter.bytes = dict.fromkeys(counter.bytes, 0)
    wall, cpu = [], []
    for _ in range(args.steps):
        dist.barrier()
        wall_start, cpu_start = time.perf_counter(), cpu_s()
        step()
        wall.append(time.perf_counter() - wall_start)
        cpu.append(cpu_s() - cpu_start)
    peak_step = peak_rss_mib() - baseline
    sent = {kind: count // args.steps for kind, count in counter.bytes.items()}
    with LiveTensorTracker() as tracker:
        step()
    record = {
        "rank": rank,
        "peak_step_mib": round(peak_step, 1),
        "live_tensor_peak_mib": round(tracker.peak_mib + bucket_mib, 1),  # + gradient buckets made before
        "step_wall_s": round(statistics.median(wall), 3),
        "step_cpu_s": round(statistics.median(cpu), 3),
        "bytes_activations": sent["activations"],
        "bytes_gradients": sent["gradients"],
    }
    records = [None] * ranks
    dist.all_gather_object(records, record)
    if rank == 0:
        Path(out).write_text(json.dumps(records))
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--grid", default="96x192")
    p.add_argument("--mesh-res", type=int, default=4)
    p.add_argument("--channels", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--num-vars", type=int, default=8)
    p.add_argument("--multistep", type=int, default=2)
    p.add_argument("--num-chunks", type=int, default=4, help="mapper chunks")
    p.add_argument("--processor-chunks", type=int, default=4)
    p.add_argument("--ranks", default="1,2,4", help="ranks per model to run")
    p.add_argument("--strategies", default="edges,heads")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    _, lat, lon = grid_coordinates(args.grid)
    graph = build_graph(lat, lon, mesh_resolution=args.mesh_res)
    settings = []
    with tempfile.TemporaryDirectory() as tmp:
        graph_path = str(Path(tmp) / "graph.pt")
        torch.save(graph, graph_path)
        for ranks in (int(r) for r in args.ranks.split(",")):
            for strategy in args.strategies.split(",") if ranks > 1 else ["edges"]:
                out = str(Path(tmp) / f"{ranks}-{strategy}.json")
                started = time.perf_counter()
                mp.spawn(worker, args=(ranks, free_port(), args, graph_path, strategy, out), nprocs=ranks, join=True)
                per_rank = json.loads(Path(out).read_text())
                settings.append(
                    {
                        "ranks_per_model": ranks,
                        "strategy": strategy if ranks > 1 else "none",
                        "seconds": round(time.perf_counter() - started, 1),
                        "peak_step_mib_max": max(r["peak_step_mib"] for r in per_rank),
                        "live_tensor_peak_mib_max": max(r["live_tensor_peak_mib"] for r in per_rank),
                        "step_cpu_s_max": max(r["step_cpu_s"] for r in per_rank),
                        "step_cpu_s_sum": round(sum(r["step_cpu_s"] for r in per_rank), 3),
                        "bytes_per_step_all_ranks": {
                            kind: sum(r[f"bytes_{kind}"] for r in per_rank) for kind in ("activations", "gradients")
                        },
                        "per_rank": per_rank,
                    }
                )
    size = {k: v for k, v in vars(args).items() if k not in ("ranks", "strategies")}
    print(json.dumps({"benchmark": "sharding", "args": size, "graph": _graph_sizes(graph), "settings": settings}))


def _graph_sizes(graph) -> dict:
    return {
        "data_nodes": int(graph["data"].num_nodes),
        "hidden_nodes": int(graph["hidden"].num_nodes),
        "edges": {"->".join((s, d)): int(graph[(s, r, d)].edge_index.shape[1]) for s, r, d in graph.edge_types},
    }


if __name__ == "__main__":
    main()

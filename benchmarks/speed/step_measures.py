"""Measuring helpers of the step-time harness (``step_time.py``): clocks, CPU time, machine load and speed, CUDA
memory, matmul FLOPs, the benchmark grids and the graph summary fields the anchor harness also prints."""

from __future__ import annotations

import os
import time


def machine_load() -> dict:
    """Load average and CPU pressure: the machine may be shared."""
    load = {"loadavg_1m": round(os.getloadavg()[0], 2)}
    try:
        with open("/proc/pressure/cpu") as f:
            load["cpu_pressure_some_avg10"] = float(f.readline().split()[1].split("=")[1])
    except (OSError, IndexError, ValueError):
        pass
    return load


def calibrate_matmul(torch, n: int = 1024, reps: int = 8) -> float:
    """GFLOP/s of an fp32 n x n matmul: a machine-speed yardstick recorded beside each result."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    return 2.0 * n**3 * reps / (time.perf_counter() - start) / 1e9


def count_step_flops(torch, step) -> int:
    """Matrix-multiply FLOPs of one ``step()``, in-place ``addmm_`` (weight-gradient accumulation) included."""
    from torch.utils.flop_counter import FlopCounterMode, register_flop_formula

    if torch.ops.aten.addmm_ not in torch.utils.flop_counter.flop_registry:

        @register_flop_formula(torch.ops.aten.addmm_)
        def _addmm_inplace(acc_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
            return 2 * a_shape[0] * a_shape[1] * b_shape[1]

    with FlopCounterMode(display=False) as counter:
        step()
    return counter.get_total_flops()


class WallClock:
    """A host time stamp."""

    def __init__(self) -> None:
        self.at = time.perf_counter()

    def seconds_since(self, earlier: WallClock) -> float:
        return self.at - earlier.at


class CudaClock:
    """A CUDA event recorded on the current stream: differences are GPU time, read once the later event is done."""

    def __init__(self, torch) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record()

    def seconds_since(self, earlier: CudaClock) -> float:
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1e3


def cuda_memory_before_steps(torch, device) -> int | None:
    """Bytes allocated on ``device`` before the timed steps, with its peak counter reset (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def cuda_memory_of_steps(torch, device, before: int | None) -> dict:
    """Peak allocated over the timed steps, in MiB: absolute and above ``before`` (no fields off CUDA)."""
    if before is None:
        return {}
    peak = torch.cuda.max_memory_allocated(device)
    return {
        "peak_mem_mib": round(peak / 2**20, 1),
        "peak_mem_steps_delta_mib": round((peak - before) / 2**20, 1),
        "gpu_name": torch.cuda.get_device_name(device),
        "cuda_memory_source": "torch.cuda.max_memory_allocated over the timed steps, reset after the warm-up",
    }


def grid_coordinates(spec: str):
    """'O<N>' -> octahedral reduced Gaussian grid; 'NLATxNLON' -> cell-centred regular lat/lon grid; 'N' -> N
    Fibonacci-sphere points. Degrees."""
    import numpy as np

    if spec.upper().startswith("O"):
        from anemo_like.data.grids import octahedral_grid

        grid = octahedral_grid(int(spec[1:]))
        return "octahedral", grid.latitudes, grid.longitudes
    if "x" in spec:
        nlat, nlon = (int(s) for s in spec.lower().split("x", 1))
        lats = -90.0 + (np.arange(nlat) + 0.5) * 180.0 / nlat
        lons = np.arange(nlon) * 360.0 / nlon
        lat2, lon2 = np.meshgrid(lats, lons, indexing="ij")
        return "latlon", lat2.ravel(), lon2.ravel()
    n = int(spec)
    i = np.arange(n) + 0.5
    return "fibonacci", np.degrees(np.arcsin(1.0 - 2.0 * i / n)), np.mod(np.degrees(np.pi * (1 + 5**0.5) * i), 360.0)


def graph_summary(graph) -> dict:
    def edges(kind: tuple[str, str, str]) -> int:
        return int(graph[kind].edge_index.shape[1]) if kind in graph.edge_types else 0

    return {
        "data_nodes": int(graph["data"].num_nodes),
        "hidden_nodes": int(graph["hidden"].num_nodes),
        "edges_data2hidden": edges(("data", "to", "hidden")),
        "edges_hidden2hidden": edges(("hidden", "to", "hidden")),
        "edges_hidden2data": edges(("hidden", "to", "data")),
        "edge_attr_dim": int(graph[("data", "to", "hidden")].edge_attr.shape[1]),
    }


def count_step_ops(step) -> dict:
    """Aten operators one ``step()`` dispatches: the total, the host syncs and every operator, by name."""
    from anemo_like.profiling.op_count import count_ops

    counter = count_ops(step)
    return {"per_step": counter.total, "syncs": counter.syncs(), "by_name": dict(counter.by_name.most_common())}


def use_triton_stand_in(torch) -> None:
    """Make the Triton graph-attention custom ops run on CPU as their shape-only stand-ins (zeros), so that the
    Triton path's host-side operators can be counted without a GPU (TRITON_INTERPRET=1 must have been set before
    triton was imported). Each custom op stays one dispatched operator, as on a GPU."""
    from anemo_like.models.ops import triton_graph_attention as kernels

    @kernels.graph_attention_op.register_kernel("cpu")
    def _forward(q, k, v, e, *index):
        return torch.zeros_like(q), q.new_zeros(q.shape[:-1], dtype=torch.float32)

    @kernels.graph_attention_backward_op.register_kernel("cpu")
    def _backward(grad_out, q, k, v, e, *saved):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(e)


def tensor_peaks(torch, step, model, optimizer) -> tuple[float, float]:
    """(peak MiB of the tensors live during one more ``step()``, that plus the tensors held across steps: weights,
    buffers, optimizer moments and the kernels' scratch), without allocator effects."""
    from anemo_like.diagnostics.live_tensors import LiveTensorTracker
    from anemo_like.models.ops import workspace

    with LiveTensorTracker() as tracker:
        step()
    # tensors that outlive a step (weights, optimizer moments) were created before it: the tracker misses them
    held = [*model.parameters(), *model.buffers()]
    if optimizer is not None:
        held += [t for state in optimizer.state.values() for t in state.values() if isinstance(t, torch.Tensor)]
    held_bytes = sum(t.untyped_storage().nbytes() for t in held) + workspace.held_bytes()
    return tracker.peak_mib, tracker.peak_mib + held_bytes / 2**20


def profile_summary(torch, step, steps: int, top: int = 15) -> dict:
    """Run ``step()`` ``steps`` times under torch.profiler and summarise per step: aten events on the host,
    kernels launched on the GPU, the top kernels by GPU time, and the GPU's idle time between its kernels (host gaps)
    over the span from the first kernel to the last. On CPU only the host side is there."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    events = prof.events()
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type.name == "CUDA")
    busy, last_end = 0.0, None
    for start, end, _ in kernels:  # union of the kernels' intervals (streams may overlap)
        start = max(start, last_end) if last_end is not None else start
        busy += max(0.0, end - start)
        last_end = end if last_end is None else max(last_end, end)
    span = (kernels[-1][1] - kernels[0][0]) if kernels else 0.0
    by_kernel: dict[str, list[float]] = {}
    for start, end, name in kernels:
        by_kernel.setdefault(name, []).append(end - start)
    ranked = sorted(by_kernel.items(), key=lambda kv: -sum(kv[1]))[:top]
    host_ops = sum(1 for e in events if e.device_type.name == "CPU" and e.name.startswith("aten::"))
    return {
        "profiled_steps": steps,
        "host_aten_events_per_step": round(host_ops / steps),  # nested: a composite op and its parts
        "kernels_per_step": round(len(kernels) / steps),
        "gpu_span_ms_per_step": round(span / 1e3 / steps, 3),
        "gpu_busy_ms_per_step": round(busy / 1e3 / steps, 3),
        "gpu_idle_fraction": round(1 - busy / span, 3) if span else None,
        "top_kernels": [
            {"name": name[:120], "calls_per_step": len(t) / steps, "ms_per_step": round(sum(t) / 1e3 / steps, 3)}
            for name, t in ranked
        ],
    }

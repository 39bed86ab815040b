"""``cuda_graphs: true`` of ``anemo-infer``: each forecast step's forward pass replayed as a CUDA graph.

A forward pass of a graph transformer launches thousands of small kernels; at the sizes where a GPU is fast, the
host issuing them sets the pace. The model's forward makes no device-to-host sync, so it can be captured once per
set of input shapes (the last batch of a run may be smaller: a second graph) and replayed: one launch per step. The
inputs are copied into the captured ones before each replay, and the output is copied out of the graph's (the next
replay overwrites it). Graphs share one memory pool.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from anemo_like.config.model_schema import ModelConfig

Inputs = tuple[Tensor, Tensor | None, Tensor | None]  # x, noise, boundary
Shapes = tuple[tuple[tuple[int, ...], torch.dtype] | None, ...]


def cuda_graph_refusal(model: ModelConfig, device: torch.device, model_ranks: int) -> str | None:
    """Why ``cuda_graphs=true`` cannot run here (one sentence ending in what to set), or None."""
    if device.type != "cuda":
        return f"cuda_graphs=true needs a CUDA device and this run is on {device.type}; set cuda_graphs=false"
    if model_ranks > 1:
        return (
            f"cuda_graphs=true: the model is sharded over {model_ranks} ranks, whose collectives are not captured; "
            "set cuda_graphs=false or num_gpus_per_model=1"
        )
    if model.compile:
        return (
            "cuda_graphs=true: the checkpoint's model.compile compiles modules, which make CUDA graphs of their own; "
            "set cuda_graphs=false"
        )
    return None


class CapturedForward:
    """Calls like the model, ``(x, noise=None, boundary=None) -> output``, by replaying a graph captured for the
    inputs' shapes and dtypes (captured on first sight: one eager warm-up pass on a side stream, then the capture)."""

    def __init__(self, forward: Callable[..., Tensor]) -> None:
        self.forward = forward
        self.graphs: dict[Shapes, tuple[torch.cuda.CUDAGraph, Inputs, Tensor]] = {}
        self.pool: tuple[int, int] | None = None

    def __call__(self, x: Tensor, noise: Tensor | None = None, boundary: Tensor | None = None) -> Tensor:
        inputs: Inputs = (x, noise, boundary)
        key = tuple(None if t is None else (tuple(t.shape), t.dtype) for t in inputs)
        if key not in self.graphs:
            self.graphs[key] = self._capture(inputs)
        graph, static, output = self.graphs[key]
        for held, given in zip(static, inputs, strict=True):
            if held is not None and given is not None:
                held.copy_(given)
        graph.replay()
        return output.clone()

    def _capture(self, inputs: Inputs) -> tuple[torch.cuda.CUDAGraph, Inputs, Tensor]:
        x, noise, boundary = (None if t is None else t.clone() for t in inputs)
        assert x is not None
        kwargs = {name: t for name, t in (("noise", noise), ("boundary", boundary)) if t is not None}
        side = torch.cuda.Stream(x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # lazily made per-stream state (cuBLAS handles, Triton kernels) first
            self.forward(x, **kwargs)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            output = self.forward(x, **kwargs)
        self.pool = graph.pool()
        return graph, (x, noise, boundary), output

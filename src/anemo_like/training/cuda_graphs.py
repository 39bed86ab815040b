"""``training.cuda_graphs``: capture one whole training step (forward, loss, backward, clipping, optimiser step)
as a CUDA graph after ``training.cuda_graph_warmup`` eager steps, then replay it for every further step.

A replay launches the whole step at once, which removes the per-kernel launch cost that dominates small models.
It needs the step to be the same every time: fixed shapes (a constant rollout), no host-device syncs, no
collectives over gloo, and an optimiser whose state and learning rate live on the device (``capturable``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from anemo_like.config.schema import RunConfig


def cuda_graph_refusal(config: RunConfig, device: torch.device, world_size: int) -> str | None:
    """Why ``training.cuda_graphs=true`` cannot run with this config on this device; None when it can."""
    training = config.training
    if device.type != "cuda":
        return f"it needs a CUDA device and this run is on {device.type}; set training.cuda_graphs=false"
    if training.rollout.start != training.rollout.max:
        return (
            f"training.rollout grows from {training.rollout.start} to {training.rollout.max} steps, which changes "
            "the captured step's shapes; set rollout.start equal to rollout.max"
        )
    if training.precision == "16-mixed":
        return "the 16-mixed gradient scaler skips steps by a host-side check; use training.precision=bf16-mixed"
    if not training.optimizer.fused:
        return (
            "training.optimizer.fused=false: the captured step skips non-finite updates inside fused AdamW; "
            "set training.optimizer.fused=true"
        )
    if world_size > 1:
        return "it runs with a single process only for now; launch one process or set training.cuda_graphs=false"
    if config.training.ensemble.members > 1:
        return "ensemble members draw fresh processor noise on the host every step; set training.cuda_graphs=false"
    if config.model.compile:
        return "model.compile is set: use torch.compile options {mode: reduce-overhead} for its own CUDA graphs"
    return None


class CapturedStep:
    """A training step captured once and replayed: ``step(batch)`` copies the batch into the captured input
    and replays; returns the captured loss tensor (overwritten by the next replay).

    ``step_fn(batch) -> loss`` must run forward, backward and the optimiser step without zeroing gradients:
    they are set to None before the capture, so the captured backward writes them rather than accumulating.
    Building it trains on ``batch`` once, eagerly on a side stream (CUDA's rule before a capture: lazily created
    per-stream state must exist first), then captures; that step's loss is ``first_loss``.
    """

    def __init__(self, step_fn: Callable[[Tensor], Tensor], batch: Tensor, optimizer: torch.optim.Optimizer) -> None:
        side = torch.cuda.Stream(batch.device)
        side.wait_stream(torch.cuda.current_stream(batch.device))
        with torch.cuda.stream(side):
            optimizer.zero_grad(set_to_none=True)
            self.first_loss = step_fn(batch)
        torch.cuda.current_stream(batch.device).wait_stream(side)
        self.batch = batch.clone()
        self.graph = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(self.graph):
            self.loss = step_fn(self.batch)

    def __call__(self, batch: Tensor) -> Tensor:
        self.batch.copy_(batch, non_blocking=True)
        self.graph.replay()
        return self.loss

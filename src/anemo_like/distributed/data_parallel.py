"""Data parallelism across model copies: identical initial weights, and gradients averaged after backward.

Gradients live in flat buckets of ``bucket_cap_mb`` (:class:`GradientBuckets`) and are all-reduced once per
step, after the whole backward (rollout steps and activation checkpointing need no special care, unlike hooks
that fire during backward).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def broadcast_parameters(model: nn.Module, *, buffers: bool = True) -> None:
    """Copy rank 0's parameters (and buffers) to every rank."""
    if world_size() == 1:
        return
    for tensor in [*model.parameters(), *(model.buffers() if buffers else ())]:
        dist.broadcast(tensor.data, src=0)


class GradientBuckets:
    """Every parameter's gradient is a view into one of a few flat buffers of about ``bucket_cap_mb`` (a buffer
    closes once it reaches the cap), so averaging over the ranks is one in-place all-reduce per buffer: no copies
    in and out, no transient buffer.

    Call :meth:`zero` before each backward (it attaches the views again); backward accumulates into them. A
    parameter left without a gradient in a step contributes zeros, so every rank reduces the same buffers in the
    same order.
    """

    def __init__(self, parameters: Iterable[nn.Parameter], *, bucket_cap_mb: float) -> None:
        cap = max(1, int(bucket_cap_mb * 2**20))
        groups: list[list[nn.Parameter]] = [[]]
        for p in (p for p in parameters if p.requires_grad):
            if groups[-1] and sum(q.numel() * q.element_size() for q in groups[-1]) >= cap:
                groups.append([])
            groups[-1].append(p)
        self.buffers: list[torch.Tensor] = []
        self.views: list[tuple[nn.Parameter, torch.Tensor]] = []
        for group in groups:
            if len({(p.dtype, p.device) for p in group}) > 1:
                raise ValueError("gradient buckets need parameters of one dtype and device")
            flat = torch.zeros(sum(p.numel() for p in group), dtype=group[0].dtype, device=group[0].device)
            offset = 0
            for p in group:
                self.views.append((p, flat[offset : offset + p.numel()].view_as(p)))
                offset += p.numel()
            self.buffers.append(flat)
        self.zero()

    def zero(self) -> None:
        """Zero every gradient, attaching the views again (``zero_grad(set_to_none=True)`` would detach them)."""
        for p, view in self.views:
            p.grad = view
        for flat in self.buffers:
            flat.zero_()

    def average(self) -> None:
        """Replace every gradient by its mean over the ranks."""
        size = world_size()
        if size == 1:
            return
        for flat in self.buffers:
            dist.all_reduce(flat)
            flat /= size


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar tensor over the ranks."""
    if world_size() == 1:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / world_size()

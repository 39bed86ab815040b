"""Data parallelism across model copies: identical initial weights, and gradients averaged after backward.

Gradients are flattened into buckets of ``bucket_cap_mb`` and all-reduced once per step, after the whole
backward (rollout steps and activation checkpointing need no special care, unlike hooks that fire during
backward). A group of one does nothing, so single-process runs share the code path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def release_process_group() -> None:
    """Leave the process group at the end of a run (nothing to do for a single process)."""
    if world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()


def broadcast_parameters(model: nn.Module) -> None:
    """Copy rank 0's parameters and buffers to every rank."""
    if world_size() == 1:
        return
    for tensor in [*model.parameters(), *model.buffers()]:
        dist.broadcast(tensor.data, src=0)


def average_gradients(model: nn.Module, *, bucket_cap_mb: float) -> None:
    """All-reduce the mean of every parameter gradient over the data-parallel ranks, bucket by bucket."""
    size = world_size()
    if size == 1:
        return
    cap = int(bucket_cap_mb * 2**20)
    bucket: list[torch.Tensor] = []
    bucket_bytes = 0
    for p in model.parameters():
        if p.grad is None:
            p.grad = torch.zeros_like(p)  # every rank must reduce the same tensors in the same order
        bucket.append(p.grad)
        bucket_bytes += p.grad.numel() * p.grad.element_size()
        if bucket_bytes >= cap:
            _reduce_bucket(bucket, size)
            bucket, bucket_bytes = [], 0
    if bucket:
        _reduce_bucket(bucket, size)


def _reduce_bucket(grads: list[torch.Tensor], size: int) -> None:
    flat = _flatten_dense_tensors(grads)
    dist.all_reduce(flat)
    flat /= size
    for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)


def any_rank(flags: tuple[bool, ...], device: torch.device) -> tuple[bool, ...]:
    """Each flag true on every rank when it is true on any rank (one tiny all-reduce for all of them)."""
    if world_size() == 1:
        return flags
    values = torch.tensor([int(f) for f in flags], device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return tuple(bool(v) for v in values.tolist())


def mean_over_ranks(value: torch.Tensor) -> torch.Tensor:
    """The mean of a scalar tensor over the ranks."""
    if world_size() == 1:
        return value
    value = value.clone()
    dist.all_reduce(value)
    return value / world_size()

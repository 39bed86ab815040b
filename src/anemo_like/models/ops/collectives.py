"""Differentiable collectives for sharding one model over the ranks of a model group.

Shapes: node features are ``(B, N, C)`` (or ``(B, N, H, C)`` with heads); a node shard is a contiguous, balanced
block of nodes (:func:`node_shard_bounds`), so shard sizes may differ by one, or be zero when there are fewer
nodes than ranks. Everything of uneven size goes through ``all_to_all_single`` with split sizes, which gloo and
NCCL both support (gloo has no uneven ``all_gather``).

Gradient conventions (the loss being differentiated is the SUM of every rank's loss):

* :func:`gather_nodes` gives every rank the full tensor, and every rank's use of it counts; its backward is an
  (uneven) reduce-scatter: this rank's input gradient is the sum over ranks of their output gradients, sliced to
  this rank's block. If every rank computes the same loss from the gathered tensor, divide that loss by the group
  size, or the gradient is counted once per rank.
* :func:`nodes_to_heads` / :func:`heads_to_nodes` and :func:`halo_exchange` only move data, so their backward
  moves gradients back (summing the gradients of rows that were sent several times).

When ``group`` is ``None`` or has a single rank nothing is communicated: every function returns its input
unchanged, except :func:`halo_exchange`, which returns an empty halo.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from anemo_like.partition import balanced_bounds


def node_shard_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous balanced ``(start, stop)`` ranges of ``range(total)``; trailing ones are empty if
    ``total < parts``."""
    bounds = balanced_bounds(total, parts)
    return bounds + [(total, total)] * (parts - len(bounds))


def _size(group: ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _exchange(x: Tensor, send_sizes: Sequence[int], recv_sizes: Sequence[int], group: ProcessGroup, dim: int) -> Tensor:
    """All-to-all along ``dim``: consecutive blocks of ``send_sizes[j]`` rows go to rank ``j``; the blocks received
    (``recv_sizes[j]`` rows from rank ``j``) are concatenated in rank order."""
    rows = x.movedim(dim, 0).contiguous()
    out = rows.new_empty((sum(recv_sizes), *rows.shape[1:]))
    dist.all_to_all_single(out, rows, list(recv_sizes), list(send_sizes), group=group)
    return out.movedim(0, dim)


def _all_gather(x: Tensor, sizes: Sequence[int], group: ProcessGroup, dim: int) -> Tensor:
    """Concatenate every rank's ``x`` (``sizes[j]`` rows along ``dim`` on rank ``j``) along ``dim``."""
    copies = len(sizes)
    return _exchange(torch.cat([x] * copies, dim), [x.shape[dim]] * copies, sizes, group, dim)


def _reduce_scatter(x: Tensor, sizes: Sequence[int], group: ProcessGroup, dim: int) -> Tensor:
    """Sum over ranks of their full ``x``, sliced to this rank's block of ``sizes`` along ``dim``."""
    own = sizes[dist.get_rank(group)]
    received = _exchange(x, sizes, [own] * len(sizes), group, dim)
    return received.unflatten(dim, (len(sizes), own)).sum(dim)


def _check_sizes(x: Tensor, sizes: Sequence[int], group: ProcessGroup, dim: int) -> None:
    rank = dist.get_rank(group)
    if len(sizes) != _size(group) or x.shape[dim] != sizes[rank]:
        raise ValueError(
            f"rank {rank} holds {x.shape[dim]} rows along dim {dim}, but the shard sizes are {list(sizes)} "
            f"for a group of {_size(group)}"
        )


class _GatherNodes(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup, sizes: Sequence[int], dim: int) -> Tensor:
        ctx.group, ctx.sizes, ctx.dim = group, sizes, dim
        return _all_gather(x, sizes, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _reduce_scatter(grad, ctx.sizes, ctx.group, ctx.dim), None, None, None


def _nodes_to_heads(x: Tensor, group: ProcessGroup, node_sizes: Sequence[int]) -> Tensor:
    batch, nodes, heads, channels = x.shape
    parts = _size(group)
    if heads % parts:
        raise ValueError(f"{heads} heads cannot be split over a model group of {parts} ranks")
    # (B, n, H, C) -> (B, P * n, H / P, C): rows grouped by the rank that receives their heads.
    by_rank = x.reshape(batch, nodes, parts, heads // parts, channels).transpose(1, 2).flatten(1, 2)
    return _exchange(by_rank, [nodes] * parts, node_sizes, group, dim=1)


def _heads_to_nodes(x: Tensor, group: ProcessGroup, node_sizes: Sequence[int]) -> Tensor:
    batch, _, heads, channels = x.shape
    parts, nodes = _size(group), node_sizes[dist.get_rank(group)]
    by_rank = _exchange(x, node_sizes, [nodes] * parts, group, dim=1)  # (B, P * n, H / P, C), by source rank
    return (
        by_rank.reshape(batch, parts, nodes, heads, channels)
        .transpose(1, 2)
        .reshape(batch, nodes, parts * heads, channels)
    )


class _NodesToHeads(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup, node_sizes: Sequence[int]) -> Tensor:
        ctx.group, ctx.node_sizes = group, node_sizes
        return _nodes_to_heads(x, group, node_sizes)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return _heads_to_nodes(grad, ctx.group, ctx.node_sizes), None, None


class _HeadsToNodes(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, group: ProcessGroup, node_sizes: Sequence[int]) -> Tensor:
        ctx.group, ctx.node_sizes = group, node_sizes
        return _heads_to_nodes(x, group, node_sizes)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return _nodes_to_heads(grad, ctx.group, ctx.node_sizes), None, None


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, group: ProcessGroup, send_index: Sequence[Tensor], recv_counts: Sequence[int], dim: int
    ) -> Tensor:
        ctx.group, ctx.recv_counts, ctx.dim, ctx.rows = group, recv_counts, dim, x.shape[dim]
        ctx.send_counts = [len(index) for index in send_index]
        ctx.index = torch.cat(list(send_index)).to(device=x.device, dtype=torch.long)
        return _exchange(x.index_select(dim, ctx.index), ctx.send_counts, recv_counts, group, dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None, None]:
        returned = _exchange(grad, ctx.recv_counts, ctx.send_counts, ctx.group, ctx.dim)
        shape = list(grad.shape)
        shape[ctx.dim] = ctx.rows
        return grad.new_zeros(shape).index_add_(ctx.dim, ctx.index, returned), None, None, None, None


def gather_nodes(x: Tensor, group: ProcessGroup | None, sizes: Sequence[int], dim: int = 1) -> Tensor:
    """Every rank's block concatenated along ``dim``: ``(B, sizes[rank], C) -> (B, sum(sizes), C)``.

    Backward: reduce-scatter (sum over ranks of the output gradients, sliced to this rank's block)."""
    if _size(group) == 1:
        return x
    _check_sizes(x, sizes, group, dim)
    return _GatherNodes.apply(x, group, list(sizes), dim)


def nodes_to_heads(x: Tensor, group: ProcessGroup | None, node_sizes: Sequence[int]) -> Tensor:
    """Node-sharded to head-sharded: ``(B, n_rank, H, C) -> (B, sum(node_sizes), H / P, C)``; rank ``j`` keeps heads
    ``[j H / P, (j + 1) H / P)``."""
    if _size(group) == 1:
        return x
    _check_sizes(x, node_sizes, group, 1)
    return _NodesToHeads.apply(x, group, list(node_sizes))


def heads_to_nodes(x: Tensor, group: ProcessGroup | None, node_sizes: Sequence[int]) -> Tensor:
    """Head-sharded to node-sharded, the inverse of :func:`nodes_to_heads`:
    ``(B, N, H / P, C) -> (B, n_rank, H, C)``."""
    if _size(group) == 1:
        return x
    if x.shape[1] != sum(node_sizes) or len(node_sizes) != _size(group):
        raise ValueError(f"{x.shape[1]} nodes do not match the shard sizes {list(node_sizes)}")
    return _HeadsToNodes.apply(x, group, list(node_sizes))


def halo_exchange(
    x: Tensor, group: ProcessGroup | None, send_index: Sequence[Tensor], recv_counts: Sequence[int], dim: int = 1
) -> Tensor:
    """Rows other ranks need from this rank's block, and the rows this rank needs from theirs.

    ``x``: ``(B, n_rank, C)``; ``send_index[j]``: local rows sent to rank ``j``; ``recv_counts[j]``: rows received
    from rank ``j``. Returns ``(B, sum(recv_counts), C)``, the received rows in rank order. Backward sends the
    gradients back and adds them into the rows they came from.
    """
    if _size(group) == 1:
        return x.narrow(dim, 0, 0)
    return _HaloExchange.apply(x, group, list(send_index), list(recv_counts), dim)


@dataclass(frozen=True)
class HaloPlan:
    """How one rank reads the source rows of its edges.

    ``send_index[j]``: local rows to send to rank ``j``; ``recv_counts[j]``: rows received from rank ``j``;
    ``edge_src``: per edge, its source row in ``cat([x_local, halo], dim)``.
    """

    send_index: list[Tensor]
    recv_counts: list[int]
    edge_src: Tensor


def plan_halo(
    edge_index_src_global: Tensor, node_bounds: Sequence[tuple[int, int]], rank: int, group: ProcessGroup | None
) -> HaloPlan:
    """Plan :func:`halo_exchange` for the edges this rank owns, from their global source ids (``(E,)``) and every
    rank's ``(start, stop)`` node block. Ranks exchange what they need once (counts, then row indices)."""
    src = edge_index_src_global.long()
    start, stop = node_bounds[rank]
    parts = len(node_bounds)
    if parts != _size(group):
        raise ValueError(f"{parts} node blocks for a model group of {_size(group)} ranks")
    local = (src >= start) & (src < stop)
    needed = torch.unique(src[~local])  # sorted, hence grouped by owner in rank order
    stops = torch.tensor([b[1] for b in node_bounds], device=src.device)
    owner = torch.searchsorted(stops, needed, right=True)
    if needed.numel() and (needed[0] < 0 or needed[-1] >= stops[-1]):
        raise ValueError(
            f"source nodes range over [{int(needed[0])}, {int(needed[-1])}], not the {int(stops[-1])} nodes"
        )
    recv_counts = torch.bincount(owner, minlength=parts)
    edge_src = torch.where(local, src - start, stop - start + torch.searchsorted(needed, src))
    if parts == 1:
        return HaloPlan([src.new_empty(0)], [0], edge_src)
    starts = torch.tensor([b[0] for b in node_bounds], device=src.device)
    send_counts = torch.empty_like(recv_counts)
    dist.all_to_all_single(send_counts, recv_counts, group=group)
    requested = needed - starts[owner]
    send_rows = requested.new_empty(int(send_counts.sum()))
    dist.all_to_all_single(send_rows, requested, send_counts.tolist(), recv_counts.tolist(), group=group)
    return HaloPlan(list(send_rows.split(send_counts.tolist())), recv_counts.tolist(), edge_src)

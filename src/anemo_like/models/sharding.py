"""Where one rank sits in its model group: the node blocks it owns and how a layer splits its heads.

A model instance sharded over P ranks keeps every node set in P contiguous balanced blocks
(:func:`~anemo_like.models.ops.collectives.node_shard_bounds`); rank r owns block r of the data grid and of the
hidden mesh. A group of one owns everything, so single-process runs take the same code path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from anemo_like.models.ops.collectives import heads_to_nodes, node_shard_bounds, nodes_to_heads

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup


@dataclass(frozen=True)
class ModelShard:
    """This rank's place in its model group (``group`` None: one rank holds the whole model)."""

    group: ProcessGroup | None = None
    rank: int = 0
    size: int = 1

    def bounds(self, total: int) -> list[tuple[int, int]]:
        """Every rank's ``(start, stop)`` block of ``total`` nodes."""
        return node_shard_bounds(total, self.size)

    def block(self, total: int) -> tuple[int, int]:
        """This rank's ``(start, stop)`` block of ``total`` nodes."""
        return self.bounds(total)[self.rank]

    def sizes(self, total: int) -> list[int]:
        """Every rank's block size."""
        return [stop - start for start, stop in self.bounds(total)]


@dataclass(frozen=True)
class HeadSplit:
    """Head sharding of one attention call: rows arrive node-sharded (``src_sizes``/``dst_sizes`` per rank) and
    attention runs over all nodes for this rank's ``H / P`` heads."""

    shard: ModelShard
    src_sizes: list[int]
    dst_sizes: list[int]

    @classmethod
    def of(cls, shard: ModelShard, num_src: int, num_dst: int) -> HeadSplit | None:
        """The split for ``num_src`` -> ``num_dst`` nodes; None for a group of one (nothing to split)."""
        return None if shard.size == 1 else cls(shard, shard.sizes(num_src), shard.sizes(num_dst))

    def head_rows(self, heads: int, width: int) -> slice:
        """This rank's rows of a (H * width, ...) projection weight, heads outermost."""
        per_rank = heads // self.shard.size
        return slice(self.shard.rank * per_rank * width, (self.shard.rank + 1) * per_rank * width)

    def to_heads(self, x: Tensor, *, source: bool) -> Tensor:
        """(B, n_rank, H, C) node-sharded -> (B, N, H / P, C) head-sharded."""
        return nodes_to_heads(x, self.shard.group, self.src_sizes if source else self.dst_sizes)

    def to_nodes(self, x: Tensor) -> Tensor:
        """(B, N_dst, H / P, C) head-sharded -> (B, n_dst_rank, H, C) node-sharded."""
        return heads_to_nodes(x, self.shard.group, self.dst_sizes)

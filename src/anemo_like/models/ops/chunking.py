"""Destination-sorted edges and the ways they are cut.

- ``DestinationRange`` (model sharding): the edges into one rank's contiguous block of destination nodes.
- ``DestinationChunk`` (mapper chunks, ``model.encoder/decoder.num_chunks``): a contiguous block of destination
  nodes, the contiguous slice of edges that point to it and the source rows those edges use (relabelled).
- ``EdgeBlock`` (inside the ``torch`` attention backend): a destination-aligned slice of at most a given number
  of edges, so per-edge tensors never exceed a fixed size. A destination's edges never straddle two blocks, so
  each block's softmax is complete.

Plans are built once per edge set, count and device, and reused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from anemo_like.partition import balanced_bounds


@dataclass(frozen=True)
class EdgeBlock:
    """Edges [edge_start, edge_stop) all pointing into destinations [dst_start, dst_stop)."""

    dst_start: int
    dst_stop: int
    edge_start: int
    edge_stop: int
    src: Tensor  # (E_block,) source rows
    dst_local: Tensor  # (E_block,) destination rows minus dst_start


class SortedEdges:
    """Edges (2, E) sorted by destination, over ``num_dst`` destinations, with cached edge-block plans."""

    def __init__(self, edge_index: Tensor, num_dst: int) -> None:
        dst = edge_index[1]
        if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
            raise ValueError("graph-attention edges must be sorted by destination node")
        self.src, self.dst, self.num_dst = edge_index[0], dst, num_dst
        self._blocks: dict[tuple[int, int], tuple[EdgeBlock, ...]] = {}

    @property
    def num_edges(self) -> int:
        """E, the number of edges."""
        return self.src.numel()

    def blocks(self, max_edges: int, min_blocks: int = 1) -> tuple[EdgeBlock, ...]:
        """Destination-aligned blocks of at most ``max_edges`` edges (more only where one destination alone has
        more), and at least ``min_blocks`` of them when there are enough destinations; cached per argument pair."""
        key = (max_edges, min_blocks)
        if key not in self._blocks:
            self._blocks[key] = self._plan_blocks(max_edges, min_blocks)
        return self._blocks[key]

    def planned_min_blocks(self) -> list[int]:
        """The ``min_blocks`` values asked for so far (for tests)."""
        return sorted({m for _, m in self._blocks})

    def _plan_blocks(self, max_edges: int, min_blocks: int) -> tuple[EdgeBlock, ...]:
        """Greedy: each block takes destinations while its edges stay within the bound."""
        bound = max(1, min(max_edges, -(-self.num_edges // min_blocks)))
        row_start = torch.searchsorted(self.dst, torch.arange(self.num_dst + 1, device=self.dst.device))
        row_start_host = row_start.cpu().numpy()
        blocks, dst_start = [], 0
        while dst_start < self.num_dst:
            limit = row_start_host[dst_start] + bound
            dst_stop = max(dst_start + 1, int(np.searchsorted(row_start_host, limit, side="right")) - 1)
            edge_start, edge_stop = int(row_start_host[dst_start]), int(row_start_host[dst_stop])
            if edge_stop > edge_start:
                blocks.append(
                    EdgeBlock(
                        dst_start,
                        dst_stop,
                        edge_start,
                        edge_stop,
                        self.src[edge_start:edge_stop],
                        self.dst[edge_start:edge_stop] - dst_start,
                    )
                )
            dst_start = dst_stop
        return tuple(blocks)


@dataclass(frozen=True)
class DestinationRange:
    """Edges [edge_start, edge_stop), those into destinations [dst_start, dst_stop); ``edges`` keeps their global
    source ids and counts destinations from ``dst_start``."""

    dst_start: int
    dst_stop: int
    edge_start: int
    edge_stop: int
    edges: SortedEdges


def _edge_range(edges: SortedEdges, dst_start: int, dst_stop: int) -> tuple[int, int]:
    bounds = torch.searchsorted(edges.dst, torch.tensor([dst_start, dst_stop], device=edges.dst.device))
    return int(bounds[0]), int(bounds[1])


def destination_range(edges: SortedEdges, dst_start: int, dst_stop: int) -> DestinationRange:
    """The edges into destinations [dst_start, dst_stop) (all of ``edges`` itself for the full range)."""
    if (dst_start, dst_stop) == (0, edges.num_dst):
        return DestinationRange(0, edges.num_dst, 0, edges.num_edges, edges)
    edge_start, edge_stop = _edge_range(edges, dst_start, dst_stop)
    local = torch.stack([edges.src[edge_start:edge_stop], edges.dst[edge_start:edge_stop] - dst_start])
    return DestinationRange(dst_start, dst_stop, edge_start, edge_stop, SortedEdges(local, dst_stop - dst_start))


@dataclass(frozen=True)
class DestinationChunk:
    """One mapper chunk: rows [dst_start, dst_stop), edges [edge_start, edge_stop) and the sources they use."""

    dst_start: int
    dst_stop: int
    edge_start: int
    edge_stop: int
    src_index: Tensor  # (S_chunk,) global source rows referenced by the chunk's edges
    edges: SortedEdges  # the chunk's edges relabelled: sources into src_index, destinations from dst_start


def plan_destination_chunks(edges: SortedEdges, num_chunks: int) -> list[DestinationChunk]:
    """Split ``edges`` into ``num_chunks`` contiguous destination chunks of balanced size."""
    chunks = []
    for dst_start, dst_stop in balanced_bounds(edges.num_dst, num_chunks):
        edge_start, edge_stop = _edge_range(edges, dst_start, dst_stop)
        src_index, src_local = torch.unique(edges.src[edge_start:edge_stop], return_inverse=True)
        local = torch.stack([src_local, edges.dst[edge_start:edge_stop] - dst_start])
        chunk_edges = SortedEdges(local, dst_stop - dst_start)
        chunks.append(DestinationChunk(dst_start, dst_stop, edge_start, edge_stop, src_index, chunk_edges))
    return chunks

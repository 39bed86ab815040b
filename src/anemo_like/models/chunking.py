"""Destination chunks: contiguous blocks of destination nodes, each owning one slice of destination-sorted edges."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from anemo_like.models.checkpointing import balanced_bounds


@dataclass(frozen=True)
class DestinationChunk:
    """One destination chunk: rows [dst_start, dst_stop), edges [edge_start, edge_stop) and the sources they use."""

    dst_start: int
    dst_stop: int
    edge_start: int
    edge_stop: int
    src_index: Tensor  # (S_chunk,) global source rows referenced by the chunk's edges
    edge_index: Tensor  # (2, E_chunk) relabelled: sources into src_index, destinations from dst_start


def plan_destination_chunks(edge_index: Tensor, num_dst: int, num_chunks: int) -> list[DestinationChunk]:
    """Split destination-sorted ``edge_index`` (2, E) into ``num_chunks`` balanced destination chunks."""
    dst = edge_index[1]
    if dst.numel() > 1 and bool((dst[1:] < dst[:-1]).any()):
        raise ValueError("chunked edges must be sorted by destination node")
    chunks = []
    for dst_start, dst_stop in balanced_bounds(num_dst, num_chunks):
        edge_start, edge_stop = (
            int(i) for i in torch.searchsorted(dst, torch.tensor([dst_start, dst_stop], device=dst.device))
        )
        src_index, src_local = torch.unique(edge_index[0, edge_start:edge_stop], return_inverse=True)
        local = torch.stack([src_local, dst[edge_start:edge_stop] - dst_start])
        chunks.append(DestinationChunk(dst_start, dst_stop, edge_start, edge_stop, src_index, local))
    return chunks

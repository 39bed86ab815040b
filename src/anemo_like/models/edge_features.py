"""One edge set: destination-sorted ``edge_index``, per-edge features and its chunk plans."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anemo_like.models.ops.chunking import (
    DestinationChunk,
    DestinationRange,
    SortedEdges,
    destination_range,
    plan_destination_chunks,
)


class EdgeFeatures(nn.Module):
    """Holds ``edge_index`` (2, E), sorted by destination, and the edge features (E, A + trainable_size):
    fixed attributes [length, direction] plus zero-initialised trainable features."""

    def __init__(self, *, edge_index: Tensor, edge_attr: Tensor, trainable_size: int, num_dst: int) -> None:
        super().__init__()
        self.num_dst = num_dst
        self.register_buffer("edge_index", edge_index.long(), persistent=False)
        self.register_buffer("fixed", edge_attr.float(), persistent=False)
        self.trainable = nn.Parameter(torch.zeros(edge_index.shape[1], trainable_size))
        self._sorted: dict[torch.device, SortedEdges] = {}
        self._ranges: dict[tuple[int, int, torch.device], DestinationRange] = {}
        self._chunks: dict[tuple[int, int, int, torch.device], list[DestinationChunk]] = {}

    @property
    def dim(self) -> int:
        """Features per edge, A + trainable_size."""
        return self.fixed.shape[1] + self.trainable.shape[1]

    def forward(self, edges: slice = slice(None)) -> Tensor:
        """Features of the edges in ``edges``, (E_slice, dim)."""
        return torch.cat([self.fixed[edges], self.trainable[edges]], dim=-1)

    def sorted_edges(self) -> SortedEdges:
        """All edges as one ``SortedEdges`` on the current device (built once per device)."""
        device = self.edge_index.device
        if device not in self._sorted:
            self._sorted[device] = SortedEdges(self.edge_index, self.num_dst)
        return self._sorted[device]

    def destinations(self, dst_start: int, dst_stop: int) -> DestinationRange:
        """The edges into destinations [dst_start, dst_stop) (a model shard), built once per range and device."""
        key = (dst_start, dst_stop, self.edge_index.device)
        if key not in self._ranges:
            self._ranges[key] = destination_range(self.sorted_edges(), dst_start, dst_stop)
        return self._ranges[key]

    def chunks(self, num_chunks: int, part: DestinationRange | None = None) -> list[DestinationChunk]:
        """Destination-chunk plan of ``part`` (default: all edges) for ``num_chunks``, built once per chunk count,
        range and device, then reused. Chunk rows and edges count from the start of ``part``."""
        part = part or self.destinations(0, self.num_dst)
        key = (num_chunks, part.dst_start, part.dst_stop, self.edge_index.device)
        if key not in self._chunks:
            self._chunks[key] = plan_destination_chunks(part.edges, num_chunks)
        return self._chunks[key]

    def planned_chunk_counts(self) -> list[int]:
        """Chunk counts planned so far."""
        return sorted({key[0] for key in self._chunks})

"""Per-edge inputs of one edge set: fixed attributes [length, direction] plus zero-initialised trainable features."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class EdgeFeatures(nn.Module):
    """Holds ``edge_index`` (2, E), sorted by destination, and the edge features (E, A + trainable_size)."""

    def __init__(self, *, edge_index: Tensor, edge_attr: Tensor, trainable_size: int) -> None:
        super().__init__()
        self.register_buffer("edge_index", edge_index.long(), persistent=False)
        self.register_buffer("fixed", edge_attr.float(), persistent=False)
        self.trainable = nn.Parameter(torch.zeros(edge_index.shape[1], trainable_size))

    @property
    def dim(self) -> int:
        return self.fixed.shape[1] + self.trainable.shape[1]

    def forward(self, edges: slice = slice(None)) -> Tensor:
        """Features of the edges in ``edges``, (E_slice, dim)."""
        return torch.cat([self.fixed[edges], self.trainable[edges]], dim=-1)

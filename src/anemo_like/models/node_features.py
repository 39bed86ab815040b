"""Per-node input features: sin/cos of latitude and longitude plus zero-initialised trainable features."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class NodeFeatures(nn.Module):
    """Features of one node set, (B, N, 4 + trainable_size) = [sin lat, sin lon, cos lat, cos lon, trainable]."""

    def __init__(self, *, latlon_rad: Tensor, trainable_size: int) -> None:
        super().__init__()
        self.register_buffer("position", torch.cat([latlon_rad.sin(), latlon_rad.cos()], dim=-1).float())
        self.trainable = nn.Parameter(torch.zeros(latlon_rad.shape[0], trainable_size))

    @property
    def num_features(self) -> int:
        """Features per node, 4 + trainable_size."""
        return self.position.shape[1] + self.trainable.shape[1]

    def forward(self, batch_size: int) -> Tensor:
        """(B, N, num_features): one copy of the features per sample (an expanded view)."""
        features = torch.cat([self.position, self.trainable], dim=-1)
        return features.unsqueeze(0).expand(batch_size, -1, -1)

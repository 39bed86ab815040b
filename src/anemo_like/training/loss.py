"""Training loss: mean squared error weighted by node area and per-variable weights."""

from __future__ import annotations

import torch
from torch import Tensor


class WeightedMSE(torch.nn.Module):
    """sum_v w_v * mean_{b,g}(a_g * err^2) / sum_v w_v, with area weights a (mean 1) and variable weights w."""

    def __init__(self, *, area_weight: Tensor, variable_weight: Tensor) -> None:
        super().__init__()
        self.register_buffer("area_weight", (area_weight / area_weight.mean()).float())
        self.register_buffer("variable_weight", (variable_weight / variable_weight.sum()).float())

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        """prediction, target: (B, G, V) -> scalar."""
        squared = (prediction - target).square().mean(0)  # (G, V)
        return (self.area_weight @ squared / squared.shape[0]) @ self.variable_weight

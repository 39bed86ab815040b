"""Training loss: mean squared error weighted by node area and per-variable weights, skipping missing targets."""

from __future__ import annotations

import torch
from torch import Tensor


class WeightedMSE(torch.nn.Module):
    """sum_v w_v * mse_v with mse_v the area-weighted mean of err^2 over batch and grid, variable weights w.

    Non-finite target values (NaN: missing data kept by ``data.nan_policy: mask``) are left out of both the sum and
    the normaliser of their variable; without them this equals sum_v w_v * mean_{b,g}(a_g * err^2) (area mean 1).
    """

    def __init__(self, *, area_weight: Tensor, variable_weight: Tensor) -> None:
        super().__init__()
        self.register_buffer("area_weight", (area_weight / area_weight.mean()).float())
        self.register_buffer("variable_weight", (variable_weight / variable_weight.sum()).float())

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        """prediction, target: (B, G, V) -> scalar."""
        valid = target.isfinite()
        squared = torch.where(valid, prediction - target, 0.0).square()  # (B, G, V)
        area = self.area_weight[:, None]  # (G, 1)
        weighted_sum = (squared * area).sum((0, 1))  # (V,)
        weight_sum = (valid * area).sum((0, 1))  # (V,)
        return (weighted_sum / weight_sum.clamp_min(torch.finfo(weight_sum.dtype).tiny)) @ self.variable_weight

"""The ensemble training loss: a kernel CRPS over the members, weighted over the grid and variables like
:class:`anemo_like.training.loss.WeightedLoss`."""

from __future__ import annotations

import torch
from torch import Tensor

from anemo_like.scoring.crps import CRPS_KINDS, crps


class EnsembleCRPSLoss(torch.nn.Module):
    """sum_v w_v * C_v with C_v the node-weighted mean over batch and grid of the CRPS of the members (``kind``
    of :data:`CRPS_KINDS`), variable weights w (normalised to sum 1) and node weights a (normalised to mean 1).

    Non-finite target values are left out of both the sum and the normaliser of their variable.
    """

    def __init__(
        self, *, area_weight: Tensor, variable_weight: Tensor, kind: str = "almost_fair", alpha: float = 0.95
    ) -> None:
        super().__init__()
        if kind not in CRPS_KINDS:
            raise ValueError(f"unknown CRPS kind '{kind}'; use one of {', '.join(CRPS_KINDS)}")
        if kind == "almost_fair" and not 0.0 < alpha <= 1.0:
            raise ValueError(f"almost-fair CRPS needs alpha in (0, 1], got {alpha}")
        self.kind, self.alpha = kind, float(alpha)
        self.register_buffer("area_weight", (area_weight / area_weight.mean()).float())
        self.register_buffer("variable_weight", (variable_weight / variable_weight.sum()).float())

    def describe(self) -> str:
        """E.g. 'afCRPS(alpha 0.95)', 'fair CRPS' or 'standard CRPS'."""
        return f"afCRPS(alpha {self.alpha:g})" if self.kind == "almost_fair" else f"{self.kind} CRPS"

    def forward(self, members: Tensor, target: Tensor) -> Tensor:
        """members (B, M, G, V), target (B, G, V) -> scalar."""
        valid = target.isfinite()
        # finite stand-ins for missing targets keep the gradient finite; their CRPS is masked out below
        score = crps(members, torch.where(valid, target, 0.0), kind=self.kind, alpha=self.alpha, dim=1)
        score = torch.where(valid, score, 0.0)  # (B, G, V)
        area = self.area_weight[:, None]  # (G, 1)
        weighted_sum = (score * area).sum((0, 1))  # (V,)
        weight_sum = (valid * area).sum((0, 1))  # (V,)
        per_variable = weighted_sum / weight_sum.clamp_min(torch.finfo(weight_sum.dtype).tiny)
        return (per_variable * self.variable_weight).sum()  # promotes (unlike @) for float64 members

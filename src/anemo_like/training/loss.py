"""Training losses: a pointwise error (squared, absolute, Huber or a weighted sum of them) averaged over the grid with
node weights and summed over variables with variable weights, skipping missing targets (``training.loss``)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from anemo_like.config.loss_schema import LossConfig

POINTWISE = ("mse", "mae", "huber")


def pointwise_error(name: str, difference: Tensor, *, huber_delta: float = 1.0) -> Tensor:
    """The error of each element of ``difference`` (prediction - target): mse d^2, mae |d|, huber
    0.5 d^2 where |d| <= delta else delta (|d| - 0.5 delta) (torch's ``huber_loss``)."""
    if name == "mse":
        return difference.square()
    if name == "mae":
        return difference.abs()
    if name == "huber":
        size = difference.abs()
        return torch.where(size <= huber_delta, 0.5 * difference.square(), huber_delta * (size - 0.5 * huber_delta))
    raise ValueError(f"unknown loss '{name}'; use one of {', '.join(POINTWISE)}")


class WeightedLoss(torch.nn.Module):
    """sum_v w_v * L_v with L_v the node-weighted mean over batch and grid of sum_k c_k e_k(err), the terms ``terms``
    ((name, c_k) pairs of :data:`POINTWISE` errors e_k), variable weights w (normalised to sum 1) and node weights a
    (normalised to mean 1).

    Non-finite target values (NaN: missing data kept by ``data.nan_policy: mask``) are left out of both the sum and
    the normaliser of their variable; without them L_v = mean_{b,g}(a_g * e(err)).
    """

    def __init__(
        self,
        *,
        area_weight: Tensor,
        variable_weight: Tensor,
        terms: Sequence[tuple[str, float]] = (("mse", 1.0),),
        huber_delta: float = 1.0,
    ) -> None:
        super().__init__()
        unknown = [name for name, _ in terms if name not in POINTWISE]
        if not terms or unknown:
            raise ValueError(f"loss terms must be among {', '.join(POINTWISE)}, got {list(terms)}")
        self.terms, self.huber_delta = [(name, float(c)) for name, c in terms], float(huber_delta)
        self.register_buffer("area_weight", (area_weight / area_weight.mean()).float())
        self.register_buffer("variable_weight", (variable_weight / variable_weight.sum()).float())

    @classmethod
    def from_config(cls, config: LossConfig, *, area_weight: Tensor, variable_weight: Tensor) -> WeightedLoss:
        """The loss ``training.loss`` names, with these node (G,) and variable (V,) weights."""
        terms = [(t.name, t.weight) for t in config.terms] if config.name == "combined" else [(config.name, 1.0)]
        return cls(
            area_weight=area_weight, variable_weight=variable_weight, terms=terms, huber_delta=config.huber_delta
        )

    def describe(self) -> str:
        """E.g. 'mse' or '1 mse + 0.5 huber(delta 1)'."""
        names = [name if name != "huber" else f"huber(delta {self.huber_delta:g})" for name, _ in self.terms]
        if len(self.terms) == 1 and self.terms[0][1] == 1:
            return names[0]
        return " + ".join(f"{c:g} {name}" for name, (_, c) in zip(names, self.terms, strict=True))

    def pointwise(self, difference: Tensor) -> Tensor:
        """sum_k c_k e_k(difference), elementwise (a single term of weight 1 exactly e(difference))."""
        total = None
        for name, weight in self.terms:
            error = pointwise_error(name, difference, huber_delta=self.huber_delta)
            error = error if weight == 1 else error * weight
            total = error if total is None else total + error
        return total

    def forward(self, prediction: Tensor, target: Tensor) -> Tensor:
        """prediction, target: (B, G, V) -> scalar."""
        valid = target.isfinite()
        error = self.pointwise(torch.where(valid, prediction - target, 0.0))  # (B, G, V)
        area = self.area_weight[:, None]  # (G, 1)
        weighted_sum = (error * area).sum((0, 1))  # (V,)
        weight_sum = (valid * area).sum((0, 1))  # (V,)
        return (weighted_sum / weight_sum.clamp_min(torch.finfo(weight_sum.dtype).tiny)) @ self.variable_weight


class WeightedMSE(WeightedLoss):
    """The squared-error :class:`WeightedLoss` (``training.loss.name: mse``): sum_v w_v * mse_v with mse_v the
    node-weighted mean of err^2 over batch and grid."""

    def __init__(self, *, area_weight: Tensor, variable_weight: Tensor) -> None:
        super().__init__(area_weight=area_weight, variable_weight=variable_weight)

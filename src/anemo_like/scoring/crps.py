"""Kernel CRPS estimators over an ensemble (member) dimension, and the closed-form CRPS of a Gaussian.

For members x_1..x_M and truth y, with MAE = mean_m |x_m - y| and S = sum_{m,k} |x_m - x_k|:

- standard (energy form, biased high): MAE - S / (2 M^2)
- fair (unbiased for the CRPS of the distribution the members are drawn from): MAE - S / (2 M (M - 1))
- almost_fair (afCRPS of Lang et al. 2024): MAE - (1 - eps) S / (2 M (M - 1)), eps = (1 - alpha) / M,
  which equals alpha * fair + (1 - alpha) * standard.

S is computed in O(M log M) from the sorted members, so memory stays O(M) per point.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CRPS_KINDS = ("standard", "fair", "almost_fair")


def pairwise_abs_sum(members: Tensor, *, dim: int = 1) -> Tensor:
    """sum_{m,k} |x_m - x_k| over the member dimension ``dim`` (size M), as 2 sum_i (2i - M + 1) x_(i) with
    x_(0) <= ... <= x_(M-1) the sorted members; shape of ``members`` without ``dim``, same units and dtype.

    The sorted members are shifted by their minimum first (the weights sum to zero), which keeps float32 accurate
    for offset fields (e.g. temperatures in K) and makes the sum exactly 0 when all members are equal.
    """
    size = members.shape[dim]
    ordered = members.sort(dim=dim).values
    ordered = ordered - ordered.narrow(dim, 0, 1)
    shape = [1] * members.dim()
    shape[dim] = size
    weight = torch.arange(size, device=members.device, dtype=members.dtype) * 2 - (size - 1)
    return 2 * (ordered * weight.reshape(shape)).sum(dim)


def _spread_coefficient(kind: str, alpha: float, size: int) -> float:
    """The factor c of S in CRPS = MAE - c * S for ensemble size ``size`` (M)."""
    if kind not in CRPS_KINDS:
        raise ValueError(f"unknown CRPS kind '{kind}'; use one of {', '.join(CRPS_KINDS)}")
    if kind == "standard":
        return 1.0 / (2 * size**2)
    if size < 2:
        raise ValueError(f"the {kind} CRPS needs at least 2 ensemble members, got M={size}")
    if kind == "fair":
        return 1.0 / (2 * size * (size - 1))
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"almost-fair CRPS needs alpha in (0, 1], got {alpha}")
    return (1.0 - (1.0 - alpha) / size) / (2 * size * (size - 1))


def crps(members: Tensor, target: Tensor, *, kind: str = "fair", alpha: float = 0.95, dim: int = 1) -> Tensor:
    """Elementwise kernel CRPS of the ensemble ``members`` (member dimension ``dim``, size M) against ``target``
    (the shape of ``members`` without ``dim``); returns the shape of ``target`` in the units of the inputs.

    ``kind`` is one of :data:`CRPS_KINDS` (see the module docstring); ``alpha`` only matters for almost_fair.
    Works in the input dtype and is differentiable; targets must be finite (mask missing ones before).
    """
    dim = dim % members.dim()
    expected = members.shape[:dim] + members.shape[dim + 1 :]
    if target.shape != expected:
        raise ValueError(f"target shape {tuple(target.shape)} does not match members without dim {dim}: {expected}")
    coefficient = _spread_coefficient(kind, alpha, members.shape[dim])
    skill = (members - target.unsqueeze(dim)).abs().mean(dim)
    return skill - coefficient * pairwise_abs_sum(members, dim=dim)


def gaussian_crps(mean: Tensor, std: Tensor, target: Tensor) -> Tensor:
    """CRPS of N(mean, std^2) against ``target`` (broadcast shapes, units of the inputs):
    std [z (2 Phi(z) - 1) + 2 phi(z) - 1/sqrt(pi)] with z = (target - mean) / std."""
    z = (target - mean) / std
    density = torch.exp(-0.5 * z.square()) / math.sqrt(2 * math.pi)
    return std * (z * (2 * torch.special.ndtr(z) - 1) + 2 * density - 1 / math.sqrt(math.pi))

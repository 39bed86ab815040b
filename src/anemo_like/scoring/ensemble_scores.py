"""Probabilistic verification of ensemble forecasts, accumulated per lead and variable: fair CRPS, RMSE of the
ensemble mean, ensemble spread (spread/skill) and rank histograms.

Only torch, numpy and :mod:`anemo_like.scoring.crps` are imported here, so inference and validation can share it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from anemo_like.scoring.crps import crps

SUMS = ("crps_sum", "squared_error_sum", "variance_sum", "weight_sum")


@dataclass
class EnsembleScoreSums:
    """Area-weighted sums over batch and grid, per lead and variable (L, V), of the fair CRPS, the squared error of
    the ensemble mean and the unbiased (ddof 1) member variance, their weights (NaN-free points only), and the
    rank counts (L, V, M + 1) of the target among the M members. Ties are broken uniformly with ``rng``."""

    crps_sum: np.ndarray
    squared_error_sum: np.ndarray
    variance_sum: np.ndarray
    weight_sum: np.ndarray
    rank_counts: np.ndarray
    num_members: int
    rng: np.random.Generator = field(repr=False, compare=False)

    @classmethod
    def zeros(cls, *, num_leads: int, num_variables: int, num_members: int, seed: int = 0) -> EnsembleScoreSums:
        """Empty sums for ``num_leads`` leads, ``num_variables`` variables and ensembles of ``num_members`` (>= 2)."""
        if num_members < 2:
            raise ValueError(f"ensemble scores need at least 2 members, got M={num_members}")
        sums = {name: np.zeros((num_leads, num_variables)) for name in SUMS}
        ranks = np.zeros((num_leads, num_variables, num_members + 1), dtype=np.int64)
        return cls(**sums, rank_counts=ranks, num_members=num_members, rng=np.random.default_rng(seed))

    def add(
        self, lead: int, members: np.ndarray | Tensor, target: np.ndarray | Tensor, area_weight: np.ndarray | Tensor
    ) -> None:
        """Accumulate one batch at lead index ``lead``: members (B, M, G, V) and target (B, G, V) in physical units,
        area_weight (G,) any positive node weights (every score is a weighted mean: only their ratios count).
        Computed in float64 on the device of ``members``."""
        x = torch.as_tensor(members).detach().to(torch.float64)
        y = torch.as_tensor(target).to(device=x.device, dtype=torch.float64)
        area = torch.as_tensor(area_weight).to(device=x.device, dtype=torch.float64)
        batch, size, grid, num_variables = x.shape
        if size != self.num_members or num_variables != self.crps_sum.shape[1]:
            raise ValueError(f"members {tuple(x.shape)} do not match M={self.num_members}, V={self.crps_sum.shape[1]}")
        if y.shape != (batch, grid, num_variables) or area.shape != (grid,):
            raise ValueError(f"target {tuple(y.shape)} / area {tuple(area.shape)} do not match members {x.shape}")
        valid = y.isfinite()
        y = torch.where(valid, y, 0.0)
        weight = torch.where(valid, area[:, None], 0.0)  # (B, G, V)
        fields = {
            "crps_sum": crps(x, y, kind="fair", dim=1),
            "squared_error_sum": (x.mean(1) - y).square(),
            "variance_sum": x.var(1, correction=1),
        }
        for name, value in fields.items():
            getattr(self, name)[lead] += (value * weight).sum((0, 1)).cpu().numpy()
        self.weight_sum[lead] += weight.sum((0, 1)).cpu().numpy()
        self._add_ranks(lead, x, y, valid)

    def _add_ranks(self, lead: int, members: Tensor, target: Tensor, valid: Tensor) -> None:
        """Count the rank (0..M) of each valid target among the members (B, M, G, V), ties broken at random."""
        below = (members < target[:, None]).sum(1).cpu().numpy()  # (B, G, V)
        ties = (members == target[:, None]).sum(1).cpu().numpy()
        valid = valid.cpu().numpy()
        tied = valid & (ties > 0)
        below[tied] += self.rng.integers(0, ties[tied] + 1)
        bins = self.num_members + 1
        index = np.arange(below.shape[-1]) * bins + below  # variable-major bin index, (B, G, V)
        counts = np.bincount(index[valid], minlength=below.shape[-1] * bins)
        self.rank_counts[lead] += counts.reshape(-1, bins)

    def merge(self, other: EnsembleScoreSums) -> None:
        """Add the sums and rank counts of ``other`` (same leads, variables and ensemble size) to these."""
        if other.num_members != self.num_members or other.rank_counts.shape != self.rank_counts.shape:
            raise ValueError(f"cannot merge scores of shape {other.rank_counts.shape} into {self.rank_counts.shape}")
        for name in (*SUMS, "rank_counts"):
            getattr(self, name)[...] += getattr(other, name)

    def as_arrays(self) -> dict[str, np.ndarray]:
        """crps, ensemble_mean_rmse, spread, spread_skill (L, V) in physical units (ratio unitless) and
        rank_histogram (L, V, M + 1) frequencies; NaN where a lead/variable saw no valid point.

        spread = sqrt(mean variance * (M + 1) / M): with the ddof-1 variance, a calibrated ensemble has a spread
        equal to the expected RMSE of its mean (whose error variance is sigma^2 (1 + 1/M))."""
        size = self.num_members
        with np.errstate(divide="ignore", invalid="ignore"):
            rmse = np.sqrt(self.squared_error_sum / self.weight_sum)
            spread = np.sqrt(self.variance_sum / self.weight_sum * (size + 1) / size)
            return {
                "crps": self.crps_sum / self.weight_sum,
                "ensemble_mean_rmse": rmse,
                "spread": spread,
                "spread_skill": spread / rmse,
                "rank_histogram": self.rank_counts / self.rank_counts.sum(-1, keepdims=True),
            }

    def records(self, *, variables: list[str], leads: list[str]) -> dict[str, float]:
        """Flat scores crps_<var>_<lead>, ens_rmse_<var>_<lead>, spread_<var>_<lead> and ssr_<var>_<lead>."""
        if (len(leads), len(variables)) != self.crps_sum.shape:
            raise ValueError(f"{len(leads)} leads x {len(variables)} variables do not match {self.crps_sum.shape}")
        arrays = self.as_arrays()
        names = {"crps": "crps", "ens_rmse": "ensemble_mean_rmse", "spread": "spread", "ssr": "spread_skill"}
        return {
            f"{prefix}_{variable}_{lead}": float(arrays[key][i, v])
            for prefix, key in names.items()
            for v, variable in enumerate(variables)
            for i, lead in enumerate(leads)
        }

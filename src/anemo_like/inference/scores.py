"""Area-weighted RMSE and bias per lead time and variable, accumulated over forecasts; the verification table."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BASELINES = ("persistence", "climatology")


class ErrorSums:
    """Sums over forecasts of area-weighted errors, per lead and variable; non-finite errors (no truth) left out."""

    def __init__(self, *, weight: np.ndarray, num_leads: int, num_variables: int) -> None:
        self.weight = np.asarray(weight, np.float64) / np.sum(weight)  # (G,), sums to 1
        self.squared = np.zeros((num_leads, num_variables))
        self.linear = np.zeros((num_leads, num_variables))
        self.covered = np.zeros((num_leads, num_variables))

    def add(self, lead: int, error: np.ndarray) -> None:
        """error: (G, V) forecast minus truth, physical units."""
        ok = np.isfinite(error)
        error = np.where(ok, error, 0.0)
        self.squared[lead] += self.weight @ error**2
        self.linear[lead] += self.weight @ error
        self.covered[lead] += self.weight @ ok

    def rmse(self) -> np.ndarray:
        """(L, V); NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(self.squared / self.covered)

    def bias(self) -> np.ndarray:
        """(L, V) mean of forecast minus truth; NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.linear / self.covered


@dataclass(frozen=True, kw_only=True)
class Verification:
    """Scores of the forecast and the baselines, (L, V) each, physical units, for the scored lead times only.

    Persistence (the initial state) exists for prognostic variables only: its columns from ``num_prognostic`` on
    are NaN. Climatology is None when no climatology was available.
    """

    variables: list[str]  # output variables, prognostic first
    num_prognostic: int
    leads: list[str]  # e.g. "6h", "5d"
    lead_hours: list[float]
    forecasts: list[int]  # forecasts scored at each lead time
    rmse: dict[str, np.ndarray]  # "model", "persistence", "climatology" -> (L, V)
    bias: dict[str, np.ndarray]

    def table(self) -> str:
        """Markdown: variable, lead, forecasts scored, RMSE and bias of model and baselines, model / persistence."""
        kinds = ["model", *(k for k in BASELINES if k in self.rmse)]
        header = ["variable", "lead", "forecasts"]
        for kind in kinds:
            header += [f"{kind} RMSE", f"{kind} bias"]
        header.append("model / persistence")
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for v, name in enumerate(self.variables):
            for li, lead in enumerate(self.leads):
                cells = [name, lead, str(self.forecasts[li])]
                for kind in kinds:
                    cells += [_number(self.rmse[kind][li, v]), _number(self.bias[kind][li, v])]
                ratio = self.rmse["model"][li, v] / self.rmse["persistence"][li, v] if v < self.num_prognostic else None
                cells.append("n/a" if ratio is None else f"{ratio:.3f}")
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)


def _number(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.4g}"

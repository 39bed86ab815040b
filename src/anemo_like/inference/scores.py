"""Area-weighted RMSE, MAE and bias per lead time and variable, accumulated over forecasts; the verification table
and the scores of verification.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from anemo_like.inference.ensemble_verification import EnsembleVerification

BASELINES = ("persistence", "climatology")


class ErrorSums:
    """Sums over forecasts of area-weighted errors, per lead and variable; non-finite errors (no truth) left out."""

    def __init__(self, *, weight: np.ndarray, num_leads: int, num_variables: int) -> None:
        self.weight = np.asarray(weight, np.float64) / np.sum(weight)  # (G,), sums to 1
        self.squared = np.zeros((num_leads, num_variables))
        self.absolute = np.zeros((num_leads, num_variables))
        self.linear = np.zeros((num_leads, num_variables))
        self.covered = np.zeros((num_leads, num_variables))

    def add(self, lead: int, error: np.ndarray) -> None:
        """error: (G, V) forecast minus truth, physical units."""
        ok = np.isfinite(error)
        error = np.where(ok, error, 0.0)
        self.squared[lead] += self.weight @ error**2
        self.absolute[lead] += self.weight @ np.abs(error)
        self.linear[lead] += self.weight @ error
        self.covered[lead] += self.weight @ ok

    def rmse(self) -> np.ndarray:
        """(L, V); NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(self.squared / self.covered)

    def mae(self) -> np.ndarray:
        """(L, V) mean absolute error; NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.absolute / self.covered

    def bias(self) -> np.ndarray:
        """(L, V) mean of forecast minus truth; NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.linear / self.covered


@dataclass(frozen=True, kw_only=True)
class Verification:
    """Scores of the forecast (of an ensemble: of its mean) and the baselines, (L, V) each, physical units, for the
    scored lead times only.

    Persistence (the initial state) exists for prognostic variables only: its columns from ``num_prognostic`` on
    are NaN. Climatology is None when no climatology was available. ``ensemble``: the probabilistic scores of an
    ensemble forecast (None for a single forecast per date).
    """

    variables: list[str]  # output variables, prognostic first
    num_prognostic: int
    leads: list[str]  # e.g. "6h", "5d"
    lead_hours: list[float]
    forecasts: list[int]  # forecasts (initial dates) scored at each lead time
    rmse: dict[str, np.ndarray]  # "model", "persistence", "climatology" -> (L, V)
    mae: dict[str, np.ndarray]
    bias: dict[str, np.ndarray]
    ensemble: EnsembleVerification | None = None

    def table(self) -> str:
        """Markdown: variable, lead, forecasts scored, RMSE, MAE and bias of model and baselines, model /
        persistence RMSE."""
        kinds = ["model", *(k for k in BASELINES if k in self.rmse)]
        header = ["variable", "lead", "forecasts"]
        for kind in kinds:
            header += [f"{kind} RMSE", f"{kind} MAE", f"{kind} bias"]
        header.append("model / persistence")
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for v, name in enumerate(self.variables):
            for li, lead in enumerate(self.leads):
                cells = [name, lead, str(self.forecasts[li])]
                for kind in kinds:
                    cells += [format_score(score[kind][li, v]) for score in (self.rmse, self.mae, self.bias)]
                ratio = self.rmse["model"][li, v] / self.rmse["persistence"][li, v] if v < self.num_prognostic else None
                cells.append("n/a" if ratio is None else f"{ratio:.3f}")
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The content of verification.json: ``members``, ``leads``, ``lead_hours``, ``forecasts`` (per lead) and
        ``scores[variable][lead]`` = {rmse, mae, bias (of the model, or the ensemble mean), persistence_rmse,
        persistence_mae, climatology_rmse, climatology_mae (where there is that baseline), and of an ensemble crps,
        ens_rmse, spread, ssr}; physical units, null where nothing was scored."""
        scores: dict[str, dict[str, dict[str, float | None]]] = {}
        for v, name in enumerate(self.variables):
            scores[name] = {}
            for li, lead in enumerate(self.leads):
                cell = {key: json_score(self._score(key, li, v)) for key in ("rmse", "mae", "bias")}
                for kind in BASELINES:
                    if kind in self.rmse:
                        cell |= {f"{kind}_{key}": json_score(self._score(key, li, v, kind)) for key in ("rmse", "mae")}
                if self.ensemble is not None:
                    cell |= self.ensemble.scores(v, li)
                scores[name][lead] = cell
        members = 1 if self.ensemble is None else self.ensemble.members
        return {
            "members": members,
            "leads": self.leads,
            "lead_hours": self.lead_hours,
            "forecasts": self.forecasts,
            "scores": scores,
        }

    def _score(self, key: str, lead: int, variable: int, kind: str = "model") -> float:
        return float(getattr(self, key)[kind][lead, variable])


def format_score(value: float) -> str:
    """A table cell: 4 significant digits, ``n/a`` for NaN."""
    return "n/a" if not np.isfinite(value) else f"{value:.4g}"


def json_score(value: float) -> float | None:
    """A JSON number, None (null) for NaN or inf."""
    return float(value) if np.isfinite(value) else None

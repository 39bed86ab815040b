"""Area-weighted RMSE, MAE and bias per lead time and variable, accumulated over forecasts, for the whole grid and
its parts (the region and the rest of a combined dataset); the verification tables and the scores of
verification.json."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from anemo_like.inference.ensemble_verification import EnsembleVerification
from anemo_like.inference.score_cells import format_score, json_score

BASELINES = ("persistence", "climatology")


class ErrorSums:
    """Sums over forecasts of weighted errors, per set of points, lead and variable; non-finite errors (no truth)
    left out. ``weights`` (K, G): one row per set of points (the scored points, then each part of the grid), each
    row any non-negative weights (normalised here to sum 1)."""

    def __init__(self, *, weights: np.ndarray, num_leads: int, num_variables: int) -> None:
        weights = np.atleast_2d(np.asarray(weights, np.float64))
        total = weights.sum(axis=1, keepdims=True)
        self.weights = weights / np.where(total > 0, total, 1.0)  # (K, G)
        shape = (len(weights), num_leads, num_variables)
        self.squared, self.absolute, self.linear, self.covered = (np.zeros(shape) for _ in range(4))

    def add(self, lead: int, error: np.ndarray) -> None:
        """error: (G, V) forecast minus truth, physical units."""
        ok = np.isfinite(error)
        error = np.where(ok, error, 0.0)
        self.squared[:, lead] += self.weights @ error**2
        self.absolute[:, lead] += self.weights @ np.abs(error)
        self.linear[:, lead] += self.weights @ error
        self.covered[:, lead] += self.weights @ ok

    def rmse(self) -> np.ndarray:
        """(K, L, V); NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sqrt(self.squared / self.covered)

    def mae(self) -> np.ndarray:
        """(K, L, V) mean absolute error; NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.absolute / self.covered

    def bias(self) -> np.ndarray:
        """(K, L, V) mean of forecast minus truth; NaN where nothing was scored."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.linear / self.covered


@dataclass(frozen=True, kw_only=True)
class PartScores:
    """The scores of one part of the grid (the region, the rest): RMSE, MAE and bias, each ``kind`` ("model" and
    the baselines) -> (L, V), physical units."""

    rmse: dict[str, np.ndarray]
    mae: dict[str, np.ndarray]
    bias: dict[str, np.ndarray]

    def cell(self, lead: int, variable: int) -> dict[str, float | None]:
        """rmse, mae, bias of the model and rmse, mae of each baseline, for verification.json."""
        cell = {key: json_score(getattr(self, key)["model"][lead, variable]) for key in ("rmse", "mae", "bias")}
        for kind in BASELINES:
            if kind in self.rmse:
                cell |= {
                    f"{kind}_{key}": json_score(getattr(self, key)[kind][lead, variable]) for key in ("rmse", "mae")
                }
        return cell


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
    parts: dict[str, PartScores] = field(default_factory=dict)  # "region", "rest" of a truth with a region mask
    note: str = ""  # which points are scored, when not all of them (a limited-area dataset's interior)

    def table(self) -> str:
        """Markdown: variable, lead, forecasts scored, RMSE, MAE and bias of model and baselines, model /
        persistence RMSE; then the parts side by side (:func:`parts_table`); ``note`` first when there is one."""
        kinds = ["model", *(k for k in BASELINES if k in self.rmse)]
        header = ["variable", "lead", "forecasts"]
        for kind in kinds:
            header += [f"{kind} RMSE", f"{kind} MAE", f"{kind} bias"]
        header.append("model / persistence")
        lines = [self.note, ""] if self.note else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for v, name in enumerate(self.variables):
            for li, lead in enumerate(self.leads):
                cells = [name, lead, str(self.forecasts[li])]
                for kind in kinds:
                    cells += [format_score(score[kind][li, v]) for score in (self.rmse, self.mae, self.bias)]
                ratio = self.rmse["model"][li, v] / self.rmse["persistence"][li, v] if v < self.num_prognostic else None
                cells.append("n/a" if ratio is None else f"{ratio:.3f}")
                lines.append("| " + " | ".join(cells) + " |")
        if self.parts:
            lines += ["", parts_table(self)]
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        """The content of verification.json: ``members``, ``leads``, ``lead_hours``, ``forecasts`` (per lead) and
        ``scores[variable][lead]`` = {rmse, mae, bias (of the model, or the ensemble mean), persistence_rmse,
        persistence_mae, climatology_rmse, climatology_mae (where there is that baseline), and of an ensemble crps,
        ens_rmse, spread, ssr}; physical units, null where nothing was scored. With parts of the grid (a truth with
        a region mask), ``parts[part][variable][lead]`` holds the same deterministic scores of each part; ``points``
        says which points were scored when not all were."""
        whole = PartScores(rmse=self.rmse, mae=self.mae, bias=self.bias)
        scores: dict[str, dict[str, dict[str, float | None]]] = {}
        for v, name in enumerate(self.variables):
            scores[name] = {}
            for li, lead in enumerate(self.leads):
                extra = {} if self.ensemble is None else self.ensemble.scores(v, li)
                scores[name][lead] = whole.cell(li, v) | extra
        members = 1 if self.ensemble is None else self.ensemble.members
        document: dict[str, Any] = {
            "members": members,
            "leads": self.leads,
            "lead_hours": self.lead_hours,
            "forecasts": self.forecasts,
            "scores": scores,
        }
        if self.note:
            document["points"] = self.note
        if self.parts:
            document["parts"] = {part: self._part_json(scores) for part, scores in self.parts.items()}
        return document

    def _part_json(self, part: PartScores) -> dict[str, dict[str, dict[str, float | None]]]:
        """``[variable][lead]`` -> the part's :meth:`PartScores.cell`."""
        return {
            name: {lead: part.cell(li, v) for li, lead in enumerate(self.leads)}
            for v, name in enumerate(self.variables)
        }


def parts_table(result: Verification) -> str:
    """Markdown: variable, lead, then model RMSE, MAE, bias, persistence RMSE, model / persistence and climatology
    RMSE (where there is one), each for every part of the grid side by side (e.g. region | rest)."""
    names = list(result.parts)
    columns = [("model", "rmse", "RMSE"), ("model", "mae", "MAE"), ("model", "bias", "bias")]
    columns += [("persistence", "rmse", "persistence RMSE"), ("ratio", "", "model / persistence")]
    columns += [("climatology", "rmse", "climatology RMSE")] if "climatology" in result.rmse else []
    header = ["variable", "lead", *(f"{name} {label}" for *_, label in columns for name in names)]
    lines = [f"By part of the grid: {', '.join(names)}.", "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    for v, variable in enumerate(result.variables):
        for li, lead in enumerate(result.leads):
            cells = [variable, lead]
            for kind, key, _ in columns:
                for name in names:
                    part = result.parts[name]
                    if kind == "ratio":
                        with np.errstate(invalid="ignore", divide="ignore"):
                            ratio = part.rmse["model"][li, v] / part.rmse["persistence"][li, v]
                        cells.append(f"{ratio:.3f}" if v < result.num_prognostic and np.isfinite(ratio) else "n/a")
                    else:
                        cells.append(format_score(getattr(part, key)[kind][li, v]))
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

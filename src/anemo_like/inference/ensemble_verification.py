"""Probabilistic verification of an ensemble forecast (``members`` > 1): fair CRPS, ensemble-mean RMSE, spread and
spread/skill per variable and lead, their table, the rank histograms and the spread-skill plot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from anemo_like.inference.score_cells import format_score, json_score
from anemo_like.scoring.ensemble_scores import EnsembleScoreSums

# verification.json key -> EnsembleScoreSums.as_arrays() name
JSON_KEYS = {"crps": "crps", "ens_rmse": "ensemble_mean_rmse", "spread": "spread", "ssr": "spread_skill"}


@dataclass(frozen=True, kw_only=True)
class EnsembleVerification:
    """Scores of the M members, (L, V) each for the scored leads, physical units (spread/skill unitless):
    area-weighted over grid points and forecasts as the deterministic RMSE (points without truth left out)."""

    members: int
    crps: np.ndarray  # fair CRPS
    ensemble_mean_rmse: np.ndarray
    spread: np.ndarray  # sqrt(mean ddof-1 variance * (M + 1) / M), comparable with ensemble_mean_rmse
    spread_skill: np.ndarray  # spread / ensemble_mean_rmse; 1 for a calibrated ensemble
    rank_histogram: np.ndarray  # (L, V, M + 1) frequencies of the truth's rank among the members

    @classmethod
    def from_sums(cls, sums: EnsembleScoreSums, scored: np.ndarray) -> EnsembleVerification:
        """The scores of ``sums`` at the lead indices ``scored`` (L,)."""
        arrays = {name: value[scored] for name, value in sums.as_arrays().items()}
        return cls(members=sums.num_members, **arrays)

    def table(self, *, variables: list[str], leads: list[str], forecasts: list[int]) -> str:
        """Markdown: variable, lead, forecasts scored, CRPS, ensemble-mean RMSE, spread, spread/skill."""
        header = ["variable", "lead", "forecasts", "CRPS", "ensemble-mean RMSE", "spread", "spread / skill"]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for v, name in enumerate(variables):
            for li, lead in enumerate(leads):
                scores = (self.crps, self.ensemble_mean_rmse, self.spread, self.spread_skill)
                cells = [name, lead, str(forecasts[li]), *(format_score(score[li, v]) for score in scores)]
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def scores(self, variable: int, lead: int) -> dict[str, float | None]:
        """crps, ens_rmse, spread and ssr of one variable and lead (indices), for verification.json (None: NaN)."""
        return {key: json_score(getattr(self, name)[lead, variable]) for key, name in JSON_KEYS.items()}

    def plot(self, folder: Path, *, variables: list[str], leads: list[str], lead_index: int) -> None:
        """rank_histogram.png (at ``leads[lead_index]``) and spread_skill.png (every scored lead) in ``folder``."""
        from anemo_like.diagnostics.ensemble_plots import plot_ensemble_scores  # matplotlib

        scores = {"rank_histogram": self.rank_histogram, "spread": self.spread, "rmse": self.ensemble_mean_rmse}
        plot_ensemble_scores(folder, **scores, variables=variables, leads=leads, lead_index=lead_index)

"""PNG plots of ensemble verification: rank histograms and spread against ensemble-mean RMSE."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

MAX_PANELS = 12  # variables shown per figure; the first ones are kept


def _panels(count: int) -> tuple[plt.Figure, np.ndarray]:
    """A figure with one panel per variable (up to :data:`MAX_PANELS`, 4 columns) and its (rows, columns) axes."""
    columns = min(4, count)
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False)
    for ax in list(axes.flat)[count:]:
        ax.set_visible(False)
    return fig, axes


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_rank_histograms(
    path: Path, histogram: np.ndarray, *, variables: list[str], lead: str, lead_index: int
) -> None:
    """Rank frequencies (L, V, M + 1) of the target among M members at lead ``lead_index`` (labelled ``lead``),
    one panel per variable with the flat 1 / (M + 1) of a calibrated ensemble."""
    shown = variables[:MAX_PANELS]
    bins = histogram.shape[-1]
    fig, axes = _panels(len(shown))
    for v, (ax, name) in enumerate(zip(axes.flat, shown, strict=False)):
        ax.bar(np.arange(bins), histogram[lead_index, v], width=0.9, color="tab:blue")
        ax.axhline(1 / bins, color="black", linestyle="--", linewidth=1)
        ax.set(title=name, xlabel="rank of truth", ylabel="frequency")
        ax.set_ylim(bottom=0)
    fig.suptitle(f"rank histograms, lead {lead}")
    _save(fig, path)


def plot_spread_skill(
    path: Path, spread: np.ndarray, rmse: np.ndarray, *, variables: list[str], leads: list[str]
) -> None:
    """Ensemble spread and ensemble-mean RMSE (L, V; physical units) against lead, one panel per variable; the
    spread/skill ratio, averaged over leads, is in each title (1 for a calibrated ensemble)."""
    shown = variables[:MAX_PANELS]
    positions = np.arange(len(leads))
    fig, axes = _panels(len(shown))
    for v, (ax, name) in enumerate(zip(axes.flat, shown, strict=False)):
        ax.plot(positions, rmse[:, v], "o-", label="ensemble-mean RMSE")
        ax.plot(positions, spread[:, v], "s--", label="spread")
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = spread[:, v] / rmse[:, v]
        ratio = ratio[np.isfinite(ratio)]
        label = f"{ratio.mean():.2f}" if ratio.size else "n/a"
        ax.set(title=f"{name} (spread/skill {label})", xlabel="lead", ylabel="physical units")
        ax.set_xticks(positions, leads, rotation=45 if len(leads) > 6 else 0)
        ax.set_ylim(bottom=0)
    axes.flat[0].legend(fontsize="small")
    fig.suptitle("spread and skill")
    _save(fig, path)


def plot_ensemble_scores(
    folder: Path,
    *,
    rank_histogram: np.ndarray,
    spread: np.ndarray,
    rmse: np.ndarray,
    variables: list[str],
    leads: list[str],
    lead_index: int,
) -> None:
    """``rank_histogram.png`` at ``leads[lead_index]`` and ``spread_skill.png`` over every lead in ``folder``:
    rank_histogram (L, V, M + 1), spread and ensemble-mean rmse (L, V)."""
    histograms = folder / "rank_histogram.png"
    plot_rank_histograms(histograms, rank_histogram, variables=variables, lead=leads[lead_index], lead_index=lead_index)
    plot_spread_skill(folder / "spread_skill.png", spread, rmse, variables=variables, leads=leads)

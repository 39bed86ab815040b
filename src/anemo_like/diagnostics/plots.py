"""PNG plots of a run: the loss curve and a forecast-versus-truth map."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot_loss_curve(records: list[dict], path: Path) -> None:
    """Training loss per logged step and validation loss per validation, log scale."""
    train = [(r["step"], r["train_loss"]) for r in records if "train_loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    if train:
        ax.plot(*zip(*train, strict=True), label="train")
    if val:
        ax.plot(*zip(*val, strict=True), "o-", label="validation")
    ax.set(xlabel="step", ylabel="loss (normalised MSE)", yscale="log", title="loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_forecast_map(
    *, lat: np.ndarray, lon: np.ndarray, truth: np.ndarray, forecast: np.ndarray, title: str, path: Path
) -> None:
    """Truth, forecast and error of one field on the grid points (degrees), physical units."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    vmin, vmax = float(np.min(truth)), float(np.max(truth))
    error = forecast - truth
    limit = float(np.max(np.abs(error))) or 1.0
    panels = [
        (truth, "truth", "viridis", vmin, vmax),
        (forecast, "forecast", "viridis", vmin, vmax),
        (error, "forecast - truth", "RdBu_r", -limit, limit),
    ]
    for ax, (values, name, cmap, lo, hi) in zip(axes, panels, strict=True):
        image = ax.scatter(lon, lat, c=values, s=6, cmap=cmap, vmin=lo, vmax=hi)
        ax.set(title=name, xlabel="longitude")
        fig.colorbar(image, ax=ax)
    axes[0].set_ylabel("latitude")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_rmse_by_lead(
    *,
    variables: list[str],
    lead_hours: list[float],
    model: np.ndarray,
    persistence: np.ndarray,
    climatology: np.ndarray | None,
    path: Path,
) -> None:
    """RMSE (physical units) against lead time (h), one panel per variable: model, persistence, climatology.

    ``model`` and ``climatology`` are (L, V); ``persistence`` is (L, P) for the first P (prognostic) variables.
    """
    columns = min(4, len(variables))
    rows = -(-len(variables) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False)
    for v, (ax, name) in enumerate(zip(axes.flat, variables, strict=False)):
        ax.plot(lead_hours, model[:, v], "o-", label="model")
        if v < persistence.shape[1]:
            ax.plot(lead_hours, persistence[:, v], "s--", label="persistence")
        if climatology is not None:
            ax.plot(lead_hours, climatology[:, v], ":", color="grey", label="climatology")
        ax.set(title=name, xlabel="lead (h)", ylabel="RMSE")
        if len(lead_hours) <= 8:  # one tick per lead while they fit
            ax.set_xticks(lead_hours)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(variables) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

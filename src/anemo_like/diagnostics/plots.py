"""PNG plots of a run: the loss curve, a forecast-versus-truth map, and one of the region of a combined dataset."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

REGION_MAP = "region_map.png"  # the map of the region of a combined dataset, beside the global forecast_map.png


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
    _three_panels(lat=lat, lon=lon, truth=truth, forecast=forecast, title=title, path=path, marker_size=6)


def plot_region_map(
    *,
    lat: np.ndarray,
    lon: np.ndarray,
    truth: np.ndarray,
    forecast: np.ndarray,
    region: np.ndarray,
    title: str,
    path: Path,
) -> None:
    """Truth, forecast and error of one field (G,) on the points of ``region`` (G,) bool only, at their own
    resolution: the axes span the region's latitude/longitude box (degrees, continuous across 0 or 180 degrees)."""
    lat, lon = lat[region], contiguous_longitudes(lon[region])
    span = max(float(np.ptp(lon)), 1e-6), max(float(np.ptp(lat)), 1e-6)
    spacing = np.sqrt(span[0] * span[1] / lat.size)  # degrees between neighbouring points
    points_per_degree = max(250.0 / span[0], 220.0 / span[1])  # a panel is ~250 pt wide and ~220 pt high
    size = (points_per_degree * spacing) ** 2  # square markers that cover the panel without gaps in either direction
    half = spacing / 2  # the outer markers' half width
    box = (float(lon.min()) - half, float(lon.max()) + half, float(lat.min()) - half, float(lat.max()) + half)
    _three_panels(
        lat=lat, lon=lon, truth=truth[region], forecast=forecast[region], title=title, path=path,
        marker_size=max(size, 1.0), box=box,
    )  # fmt: skip


def contiguous_longitudes(lon: np.ndarray) -> np.ndarray:
    """``lon`` (degrees) in [0, 360) or in [-180, 180), whichever spans the smaller range (a region across 0
    degrees: [-20, 40] rather than 0..360)."""
    east, centred = np.mod(lon, 360.0), np.mod(lon + 180.0, 360.0) - 180.0
    return east if np.ptp(east) <= np.ptp(centred) else centred


def _three_panels(
    *,
    lat: np.ndarray,
    lon: np.ndarray,
    truth: np.ndarray,
    forecast: np.ndarray,
    title: str,
    path: Path,
    marker_size: float,
    box: tuple[float, float, float, float] | None = None,
) -> None:
    """Truth, forecast and forecast - truth as scatter maps; ``box`` (west, east, south, north) limits the axes."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    vmin, vmax = float(np.min(truth)), float(np.max(truth))
    error = forecast - truth
    limit = float(np.max(np.abs(error))) or 1.0
    panels = [
        (truth, "truth", "viridis", vmin, vmax),
        (forecast, "forecast", "viridis", vmin, vmax),
        (error, "forecast - truth", "RdBu_r", -limit, limit),
    ]
    marker = "o" if box is None else "s"
    for ax, (values, name, cmap, lo, hi) in zip(axes, panels, strict=True):
        image = ax.scatter(lon, lat, c=values, s=marker_size, marker=marker, cmap=cmap, vmin=lo, vmax=hi)
        ax.set(title=name, xlabel="longitude")
        if box is not None:
            ax.set(xlim=box[:2], ylim=box[2:])
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

"""The weights of the training loss (``training.scalers``), as anemoi's scalers, from the config and the dataset.

Per output variable: ``training.variable_loss_weights`` x the pressure-level factor x the tendency factor; per grid
point: the graph's area weight (or 1) times an optional latitude/longitude box mask, the region weight on the
regional points of a combined dataset and 0 on the forced boundary points of a limited-area one. :func:`build_loss`
builds the loss ``training.loss`` names with them and logs the variable weights once.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
import torch

from anemo_like.config.loss_schema import (
    ENSEMBLE_LOSSES,
    NodeMask,
    NodeScaler,
    PressureLevelScaler,
    TendencyScaler,
    eastward,
)
from anemo_like.config.schema import RunConfig
from anemo_like.data.point_masks import BOUNDARY, REGION, point_mask
from anemo_like.data.setup import DataSetup
from anemo_like.data.zarr_store import AnemoiZarr, format_frequency, read_tendency_stdev
from anemo_like.training.ensemble_loss import EnsembleCRPSLoss
from anemo_like.training.loss import WeightedLoss

LOG = logging.getLogger(__name__)

_LEVEL_SUFFIX = re.compile(r"^[A-Za-z0-9]+_(\d+)$")  # z_500, t_850: anemoi's fallback without metadata


def pressure_level(store: AnemoiZarr, name: str) -> tuple[float | None, bool]:
    """(level in hPa, or None for a variable not on pressure levels; whether it was read from the name).

    The dataset's ``variables_metadata[name].mars`` decides (``levtype: pl`` with ``levelist``, as anemoi-datasets
    writes it); a variable without mars metadata falls back to the ``_<level>`` suffix of its name (``z_500``).
    """
    mars = store.attrs.get("variables_metadata", {}).get(name, {}).get("mars")
    if isinstance(mars, dict) and "levtype" in mars:
        if mars["levtype"] != "pl":
            return None, False
        level = mars.get("levelist", mars.get("level"))
        if level is None:
            raise ValueError(
                f"{store.path}: variable '{name}' is on pressure levels (mars levtype pl) but its variables_metadata "
                "names no level (levelist); training.scalers.pressure_level needs it"
            )
        return float(level), False
    match = _LEVEL_SUFFIX.match(name)
    return (float(match.group(1)) if match else None), match is not None


def pressure_level_factors(config: PressureLevelScaler, store: AnemoiZarr, names: list[str]) -> tuple[np.ndarray, list]:
    """(V,) factors: linear slope x level, relu max(minimum, slope x level), 1 off pressure levels or with kind none;
    and the names whose level came from the name, not the metadata."""
    if config.kind == "none":
        return np.ones(len(names)), []
    factors, from_names = np.ones(len(names)), []
    for i, name in enumerate(names):
        level, from_name = pressure_level(store, name)
        if level is None:
            continue
        if from_name:
            from_names.append(name)
        factors[i] = config.slope * level if config.kind == "linear" else max(config.minimum, config.slope * level)
    return factors, from_names


def computed_tendency_stdev(
    store: AnemoiZarr, variables: np.ndarray, *, dates: tuple[int, int], stride: int, max_dates: int
) -> tuple[np.ndarray, int]:
    """Stdev (physical units) of x(t + stride) - x(t) over at most ``max_dates`` dates t evenly spaced in the range
    ``dates`` (the pair inside it) and every grid point, non-finite values left out; and the pairs read."""
    start, stop = dates
    if stop - start <= stride:
        raise ValueError(
            f"training.scalers.tendency: the training split of {store.path} holds {stop - start} dates, too few for "
            "one model step's difference"
        )
    first = np.unique(np.linspace(start, stop - stride - 1, min(max_dates, stop - stride - start)).round())
    total, squares, count = (np.zeros(len(variables)) for _ in range(3))
    for t in first.astype(np.int64):
        pair = store.read(slice(t, t + stride + 1, stride), variables).astype(np.float64)  # (2, V, G)
        change = pair[1] - pair[0]
        ok = np.isfinite(change)
        change = np.where(ok, change, 0.0)
        total, squares, count = total + change.sum(1), squares + np.square(change).sum(1), count + ok.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / count
        return np.sqrt(np.maximum(squares / count - mean**2, 0.0)), len(first)


def tendency_factors(config: TendencyScaler, run: RunConfig, data: DataSetup) -> tuple[np.ndarray, str]:
    """(V_out,) factors (scale_v / sigma_v)^2 (variance) or scale_v / sigma_v (stdev) of the prognostic outputs,
    sigma_v the stdev of their one-step change and scale_v their normalisation scale; 1 for diagnostic outputs and
    with kind none. Also where sigma came from."""
    outputs, prognostic = data.roles.output, data.roles.prognostic
    if config.kind == "none":
        return np.ones(len(outputs)), ""
    step = data.store.frequency * data.stride
    stored = read_tendency_stdev(data.store, step)
    if stored is not None:
        sigma, source = stored[data.store.variable_indices(prognostic)], "the dataset's tendency statistics"
    else:
        window = run.data.splits.train
        dates = data.store.date_range(window.start, window.end)
        variables = data.store.variable_indices(prognostic)
        sigma, pairs = computed_tendency_stdev(
            data.store, variables, dates=dates, stride=data.stride, max_dates=config.max_dates
        )
        source = f"{pairs} date pairs of the training split"
    bad = [f"{name} ({s:g})" for name, s in zip(prognostic, sigma, strict=True) if not (np.isfinite(s) and s > 0)]
    if bad:
        raise ValueError(
            f"training.scalers.tendency: the {format_frequency(step)} change of prognostic variable(s) "
            f"{', '.join(bad)} has no positive stdev in {source} of {data.store.path}; a variable that never changes "
            "is a forcing, or set training.scalers.tendency.kind=none"
        )
    scale = data.normalizer.scale[[data.normalizer.names.index(name) for name in prognostic]]
    ratio = scale / sigma
    factors = np.ones(len(outputs))
    factors[: len(prognostic)] = ratio**2 if config.kind == "variance" else ratio  # outputs: prognostic first
    return factors, source


def in_box(mask: NodeMask, latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """(G,) bool: the points inside the box; its longitudes run east from west (across 0 degrees if east < west)."""
    (south, north), west = mask.latitude, mask.longitude[0]
    span = eastward(*mask.longitude)
    return (latitudes >= south) & (latitudes <= north) & (np.mod(longitudes - west, 360.0) <= span)


def node_weights(config: NodeScaler, *, area_weight: torch.Tensor, store: AnemoiZarr) -> torch.Tensor:
    """(G,) float32: area weights (or 1), zero outside ``config.mask``, times :func:`point_factors`."""
    weights = area_weight if config.weights == "area" else torch.ones_like(area_weight)
    factors = point_factors(config, store)
    if (factors != 1).any():
        weights = weights * torch.as_tensor(factors, dtype=weights.dtype)
    if config.mask is None:
        return weights
    inside = in_box(config.mask, store.latitudes, store.longitudes)
    if not inside.any():
        raise ValueError(
            f"training.scalers.nodes.mask: no grid point of {store.path} lies in latitude {list(config.mask.latitude)}"
            f", longitude {list(config.mask.longitude)}"
        )
    return weights * torch.as_tensor(inside, dtype=weights.dtype)


def point_factors(config: NodeScaler, store: AnemoiZarr) -> np.ndarray:
    """(G,) float64 factors of the dataset's point masks: ``config.region_weight`` on the regional points (1
    elsewhere), and 0 on the forced boundary points of a limited-area dataset, which are not predicted."""
    factors = np.ones(store.shape[-1])
    if config.region_weight is not None:
        region = point_mask(store, REGION)
        if region is None:
            raise ValueError(
                f"training.scalers.nodes.region_weight: dataset {store.path} has no '{REGION}' point mask, so it has "
                "no regional points to weight; use a combined dataset (data.cutout) or set region_weight to null"
            )
        factors[region] = config.region_weight
    boundary = point_mask(store, BOUNDARY)
    if boundary is not None:
        factors[boundary] = 0.0
    return factors


def node_note(config: NodeScaler, node: torch.Tensor, store: AnemoiZarr) -> list[str]:
    """What made the node weights ``node`` (G,), for the log."""
    notes = [f"nodes {config.weights}"]
    if config.mask is not None:
        notes.append(f"{int((node > 0).sum())} of {node.numel()} points in the mask")
    if config.region_weight is not None:
        region = point_mask(store, REGION)
        notes.append(f"{int(region.sum())} regional points x {config.region_weight:g}")
    boundary = point_mask(store, BOUNDARY)
    if boundary is not None:
        notes.append(f"{int(boundary.sum())} boundary points (forced) weight 0")
    return notes


@dataclass(frozen=True)
class LossWeights:
    """The loss's node weights (G,) and variable weights (V_out,), before the loss normalises them."""

    node: torch.Tensor
    variable: torch.Tensor
    note: str  # what made them, for the log


def loss_weights(config: RunConfig, data: DataSetup, area_weight: torch.Tensor) -> LossWeights:
    """``training.variable_loss_weights`` x pressure-level x tendency factors; node weights with the mask."""
    scalers, outputs = config.training.scalers, data.roles.output
    weights = np.array([config.training.variable_loss_weights.get(n, 1.0) for n in outputs], dtype=np.float64)
    levels, from_names = pressure_level_factors(scalers.pressure_level, data.store, outputs)
    tendency, source = tendency_factors(scalers.tendency, config, data)
    node = node_weights(scalers.nodes, area_weight=area_weight, store=data.store)
    notes = node_note(scalers.nodes, node, data.store)
    if scalers.pressure_level.kind != "none":
        notes.append(f"pressure_level {scalers.pressure_level.kind}")
        notes += [f"levels of {', '.join(from_names)} from their names (no mars metadata)"] if from_names else []
    if source:
        notes.append(f"tendency {scalers.tendency.kind} from {source}")
    variable = torch.as_tensor(weights * levels * tendency, dtype=torch.float32)
    return LossWeights(node=node, variable=variable, note="; ".join(notes))


def build_loss(config: RunConfig, data: DataSetup, area_weight: torch.Tensor) -> WeightedLoss | EnsembleCRPSLoss:
    """The loss ``training.loss`` names, weighted by ``training.scalers``; logs the final variable weights. An
    ensemble loss (crps, afcrps) scores (B, M, G, V) members, the others (B, G, V) predictions."""
    weights = loss_weights(config, data, area_weight)
    cfg = config.training.loss
    loss: WeightedLoss | EnsembleCRPSLoss
    if cfg.name in ENSEMBLE_LOSSES:
        kind = "fair" if cfg.name == "crps" else "almost_fair"
        loss = EnsembleCRPSLoss(area_weight=weights.node, variable_weight=weights.variable, kind=kind, alpha=cfg.alpha)
    else:
        loss = WeightedLoss.from_config(cfg, area_weight=weights.node, variable_weight=weights.variable)
    shares = ", ".join(f"{n} {w:.4g}" for n, w in zip(data.roles.output, loss.variable_weight.tolist(), strict=True))
    LOG.info("loss %s (%s); variable weights (sum 1): %s", loss.describe(), weights.note, shares)
    return loss

"""Verify a written forecast against its dataset: scores beside persistence and climatology, a table and plots;
with the truth's point masks, also for the region and the rest (a combined dataset) or the interior only (a
limited-area dataset)."""

from __future__ import annotations

import datetime
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from anemo_like.config.schema import RunConfig
from anemo_like.data.climatology import mean_state
from anemo_like.data.open_dataset import open_dataset
from anemo_like.data.point_masks import REGION, point_mask
from anemo_like.data.zarr_store import AnemoiZarr, format_frequency, parse_frequency
from anemo_like.inference.ensemble_verification import EnsembleVerification
from anemo_like.inference.scores import ErrorSums, PartScores, Verification
from anemo_like.inference.state_source import StateSource
from anemo_like.scoring.ensemble_scores import EnsembleScoreSums
from anemo_like.scoring.score_areas import score_areas

LOG = logging.getLogger(__name__)
TABLE, JSON_SCORES = "verification.md", "verification.json"
RMSE_PLOT, MAP_PLOT = "rmse_by_lead.png", "forecast_map.png"


def training_climatology(run: RunConfig, names: list[str], *, max_dates: int) -> np.ndarray | None:
    """Mean state (G, V) float64, physical units, of at most ``max_dates`` dates of the checkpoint's training split
    of its training dataset; None (with a log line) when that dataset cannot be opened or ``max_dates`` is 0."""
    if max_dates == 0:
        return None
    try:
        store = open_dataset(run)
        window = run.data.splits.train
        start, stop = store.date_range(window.start, window.end)
        return mean_state(
            store, date_start=start, date_stop=stop, variables=store.variable_indices(names), max_dates=max_dates
        )
    except (FileNotFoundError, ValueError) as error:
        LOG.warning("no climatology baseline: the checkpoint's training data cannot be read (%s)", error)
        return None


@dataclass(frozen=True, kw_only=True)
class VerificationRequest:
    """What to verify and where the results go."""

    forecast: Path  # written by anemo-infer (named in the table)
    store: AnemoiZarr  # the truth
    initial: StateSource  # the initial states (the dataset, or the input files): persistence
    variables: list[str]  # the forecast's variables, prognostic first
    num_prognostic: int
    area_weight: np.ndarray  # (G,) any positive weights, e.g. the graph's data area weights
    climatology: np.ndarray | None  # (G, V_out) physical units
    output: Path  # folder of the table and plots
    plot_variable: str
    plot_lead: str | None  # None: the longest scored lead


def _dataset_index(store: StateSource, dates: np.ndarray) -> np.ndarray:
    """Index of each date (any shape) in the dataset, -1 where the dataset does not have it."""
    dates = dates.astype("datetime64[s]")
    index = np.clip(np.searchsorted(store.dates, dates), 0, len(store.dates) - 1)
    return np.where(store.dates[index] == dates, index, -1)


def verify_forecast(request: VerificationRequest, forecast: xr.Dataset) -> Verification | None:
    """Score every field of ``forecast`` (:func:`~anemo_like.inference.output.forecast_dataset`, the values written
    to ``request.forecast`` in any format) whose valid time the dataset holds; write the table and plots to
    ``output``. Returns None (with a log line) when no valid time is in the dataset.
    """
    store = request.store
    truth_index = _dataset_index(store, forecast["valid_time"].values)  # (N, L), -1: not in the dataset
    skipped = int((truth_index < 0).sum())
    if skipped:
        LOG.info(
            "verification: %d of %d forecast fields have valid times after the last date %s of dataset %s; "
            "they are not scored",
            skipped,
            truth_index.size,
            store.dates[-1],
            store.path,
        )
    if not (truth_index >= 0).any():
        LOG.warning("verification: no valid time of the forecast is in dataset %s; nothing scored", store.path)
        return None
    result = _score(request, forecast, truth_index)
    _write(request, result, forecast=forecast, truth_index=truth_index)
    return result


class _Sums:
    """The error sums of the model (an ensemble's mean) and the baselines, and the ensemble's scores."""

    def __init__(self, request: VerificationRequest, *, num_leads: int, members: int) -> None:
        kinds = ["model", "persistence", *([] if request.climatology is None else ["climatology"])]
        shape = {"num_leads": num_leads, "num_variables": len(request.variables)}
        self.areas = score_areas(request.store)
        weights = self.areas.weights(request.area_weight)  # (K, G): the scored points, then each part
        self.errors = {kind: ErrorSums(weights=weights, **shape) for kind in kinds}
        self.ensemble = EnsembleScoreSums.zeros(**shape, num_members=members) if members > 1 else None
        self.weight = weights[0]  # (G,)
        self.climatology = request.climatology

    def add(self, lead: int, members: np.ndarray, truth: np.ndarray, initial: np.ndarray) -> None:
        """members (M, G, V), truth (G, V), initial (G, V; NaN but for prognostic variables), physical units."""
        forecast = members[0] if len(members) == 1 else members.mean(axis=0, dtype=np.float64)
        self.errors["model"].add(lead, forecast - truth)
        self.errors["persistence"].add(lead, initial - truth)
        if self.climatology is not None:
            self.errors["climatology"].add(lead, self.climatology - truth)
        if self.ensemble is not None:
            self.ensemble.add(lead, members[None], truth[None], self.weight)

    def scores(self, row: int, scored: np.ndarray) -> PartScores:
        """RMSE, MAE and bias of every kind for row ``row`` of the point weights, at the ``scored`` leads."""
        return PartScores(
            rmse={kind: sums.rmse()[row, scored] for kind, sums in self.errors.items()},
            mae={kind: sums.mae()[row, scored] for kind, sums in self.errors.items()},
            bias={kind: sums.bias()[row, scored] for kind, sums in self.errors.items()},
        )


def _members(forecast: xr.Dataset, names: list[str], n: int) -> np.ndarray:
    """The forecasts from initial date ``n``, (M, L, G, V) float32; M = 1 without a ``number`` dimension."""
    fields = [forecast[name].isel(time=n) for name in names]
    if "number" in forecast.dims:
        return np.stack([field.transpose("number", "step", "values").values for field in fields], axis=-1)
    return np.stack([field.values for field in fields], axis=-1)[None]


def _score(request: VerificationRequest, forecast: xr.Dataset, truth_index: np.ndarray) -> Verification:
    """Scores over every (initial date, lead) with truth; leads without any truth are left out. An ensemble (a
    ``number`` dimension) is scored by its mean, and by its members in :attr:`Verification.ensemble`."""
    store, names = request.store, request.variables
    steps = forecast["step"].values
    init_index = _dataset_index(request.initial, forecast["time"].values)  # (N,)
    persisted = request.initial.variable_indices(names[: request.num_prognostic])
    sums = _Sums(request, num_leads=len(steps), members=forecast.sizes.get("number", 1))
    read_index = store.variable_indices(names)
    for n, init in enumerate(init_index):
        initial = np.full((store.shape[-1], len(names)), np.nan)  # (G, V): persistence only for prognostic ones
        initial[:, : request.num_prognostic] = request.initial.read(slice(init, init + 1), persisted)[0].T
        members = _members(forecast, names, n)  # (M, L, G, V)
        for lead, index in enumerate(truth_index[n]):
            if index >= 0:
                truth = store.read(slice(index, index + 1), read_index)[0].T.astype(np.float64)
                sums.add(lead, members[:, lead], truth, initial)
    scored = np.flatnonzero((truth_index >= 0).any(axis=0))
    leads = [_timedelta(steps[i]) for i in scored]
    whole = sums.scores(0, scored)
    return Verification(
        variables=names,
        num_prognostic=request.num_prognostic,
        leads=[format_frequency(lead) for lead in leads],
        lead_hours=[lead.total_seconds() / 3600 for lead in leads],
        forecasts=[int(c) for c in (truth_index >= 0).sum(axis=0)[scored]],
        rmse=whole.rmse,
        mae=whole.mae,
        bias=whole.bias,
        ensemble=None if sums.ensemble is None else EnsembleVerification.from_sums(sums.ensemble, scored),
        parts={name: sums.scores(k, scored) for k, name in enumerate(sums.areas.names, start=1)},
        note=sums.areas.note(),
    )


def _timedelta(value: np.timedelta64) -> datetime.timedelta:
    return value.astype("timedelta64[s]").item()


def _write(
    request: VerificationRequest, result: Verification, *, forecast: xr.Dataset, truth_index: np.ndarray
) -> None:
    """verification.md, verification.json, rmse_by_lead.png, forecast_map.png (and of a truth with a region mask
    region_map.png) in ``request.output``, and of an ensemble rank_histogram.png and spread_skill.png."""
    from anemo_like.diagnostics.plots import plot_rmse_by_lead  # matplotlib: on this rank only

    out = request.output
    out.mkdir(parents=True, exist_ok=True)
    _write_tables(request, result)
    plot_rmse_by_lead(
        variables=result.variables,
        lead_hours=result.lead_hours,
        model=result.rmse["model"],
        persistence=result.rmse["persistence"][:, : result.num_prognostic],
        climatology=result.rmse.get("climatology"),
        path=out / RMSE_PLOT,
    )
    steps = [_timedelta(s) for s in forecast["step"].values]
    lead = steps.index(parse_frequency(request.plot_lead or result.leads[-1]))
    if result.ensemble is not None:
        label = format_frequency(steps[lead])
        index = result.leads.index(label) if label in result.leads else len(result.leads) - 1
        result.ensemble.plot(out, variables=result.variables, leads=result.leads, lead_index=index)
    _write_map(request, forecast=forecast, truth_index=truth_index, lead=lead, steps=steps)


def _write_tables(request: VerificationRequest, result: Verification) -> None:
    """verification.md (the scores' tables) and verification.json (:meth:`Verification.as_json`)."""
    (request.output / TABLE).write_text(_markdown(request, result))
    document = {"forecast": str(request.forecast), "truth": str(request.store.path), **result.as_json()}
    (request.output / JSON_SCORES).write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")


def _markdown(request: VerificationRequest, result: Verification) -> str:
    """verification.md: the deterministic table, and of an ensemble the probabilistic one."""
    header = f"# Verification of {request.forecast}\n\nTruth: {request.store.path}; area-weighted, physical units.\n\n"
    ensemble = result.ensemble
    if ensemble is None:
        return header + result.table() + "\n"
    members = ensemble.members
    table = ensemble.table(variables=result.variables, leads=result.leads, forecasts=result.forecasts)
    return (
        f"{header}An ensemble of {members} members: the scores below are those of its mean.\n\n{result.table()}\n\n"
        f"## Ensemble ({members} members)\n\nFair CRPS; spread/skill = spread / ensemble-mean RMSE.\n\n{table}\n"
    )


def _write_map(
    request: VerificationRequest,
    *,
    forecast: xr.Dataset,
    truth_index: np.ndarray,
    lead: int,
    steps: list[datetime.timedelta],
) -> None:
    """forecast_map.png: ``plot_variable`` at step ``lead`` of the first forecast with truth there (of an
    ensemble: its mean); of a truth with a region mask also region_map.png, the regional points alone."""
    from anemo_like.diagnostics.plots import REGION_MAP, plot_forecast_map, plot_region_map  # matplotlib: here only

    with_truth = np.flatnonzero(truth_index[:, lead] >= 0)
    if with_truth.size == 0:
        LOG.info("verification: no forecast has truth at lead %s; no forecast map", format_frequency(steps[lead]))
        return
    n, name = int(with_truth[0]), request.plot_variable
    valid = truth_index[n, lead]
    truth = request.store.read(slice(valid, valid + 1), request.store.variable_indices([name]))[0, 0]
    init = forecast["time"].values[n].astype("datetime64[s]")
    field = forecast[name].isel(time=n, step=lead)
    ensemble = "number" in field.dims
    shown = f"{name} ensemble mean" if ensemble else name
    values = dict(
        lat=forecast["latitude"].values,
        lon=forecast["longitude"].values,
        truth=truth,
        forecast=field.mean("number").values if ensemble else field.values,
    )
    title = f"{shown} at {request.store.dates[valid]}, +{format_frequency(steps[lead])} from {init}"
    plot_forecast_map(**values, title=title, path=request.output / MAP_PLOT)
    region = point_mask(request.store, REGION)
    if region is not None:
        plot_region_map(**values, region=region, title=f"{title}, region", path=request.output / REGION_MAP)

"""What a finished run leaves in its folder: ``inference.pt``, ``validation.md``, plots and the summary line."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from anemo_like.checkpoints.inference import save_inference_checkpoint
from anemo_like.checkpoints.locate import INFERENCE_FILE
from anemo_like.data.point_masks import REGION, point_mask
from anemo_like.diagnostics.ensemble_plots import plot_ensemble_scores
from anemo_like.diagnostics.plots import (
    REGION_MAP,
    plot_forecast_map,
    plot_loss_curve,
    plot_region_map,
    plot_rmse_by_lead,
)
from anemo_like.models.member_noise import VALIDATION_STREAM, member_noise, member_seed
from anemo_like.models.rollout import rollout
from anemo_like.runtime.process_memory import peak_rss_mib
from anemo_like.scoring.ensemble_scores import EnsembleScoreSums
from anemo_like.training.metrics import MetricsLog
from anemo_like.training.setup import Run
from anemo_like.training.validation import ValidationResult

LOG = logging.getLogger(__name__)


@dataclass
class RunOutputs:
    """Where a run wrote its results, and its final validation."""

    run_dir: Path
    training_checkpoint: Path
    inference_checkpoint: Path
    metrics: Path
    validation: ValidationResult


@torch.no_grad()
def forecast_sample(run: Run, prepare) -> tuple[torch.Tensor, torch.Tensor]:
    """The first validation sample's first-lead (prediction, target), (B, G, V_out) each (every rank of a sharded
    model instance takes part); of an ensemble model: member 0's, with its validation noise. ``prepare`` makes a
    loader batch ready for the model."""
    run.model.eval()
    batch = prepare(run.data.val[0].unsqueeze(0))
    seed = member_seed(run.config.training.seed, VALIDATION_STREAM, 0, 0)
    noise = member_noise(run.model.noise_shape(1), seeds=[seed], device=batch.device)
    with run.precision.autocast():
        prediction, target = next(rollout(run.model, batch, run.spec, steps=1, noise=noise))
    run.model.train()
    return prediction.float(), target.float()


def plot_forecast(run: Run, prediction: torch.Tensor, target: torch.Tensor) -> None:
    """Map of the first lead's forecast and truth of ``diagnostics.plot_variable``, physical units; of a dataset
    with a region mask also ``region_map.png``, the regional points alone."""
    roles, normalizer = run.data.roles, run.data.normalizer
    name = run.config.diagnostics.plot_variable or roles.prognostic[0]
    v, r = roles.output.index(name), roles.read.index(name)
    scale, offset = normalizer.scale[r], normalizer.offset[r]
    date = run.data.val.dates(0)[run.config.training.multistep_input]
    store = run.data.store
    truth = target[0, :, v].cpu().numpy() * scale + offset
    forecast = prediction[0, :, v].cpu().numpy() * scale + offset
    title = f"{name} at {date}, first lead time"
    field = dict(lat=store.latitudes, lon=store.longitudes, truth=truth, forecast=forecast)
    plot_forecast_map(**field, title=title, path=run.placement.run_dir / "forecast_map.png")
    region = point_mask(store, REGION)
    if region is not None:
        path = run.placement.run_dir / REGION_MAP
        plot_region_map(**field, region=region, title=f"{title}, region", path=path)


def write_plots(run: Run, result: ValidationResult, metrics: MetricsLog, sample: tuple[torch.Tensor, torch.Tensor]):
    folder = run.placement.run_dir
    plot_loss_curve(metrics.records, folder / "loss_curve.png")
    plot_rmse_by_lead(
        variables=result.variables,
        lead_hours=result.lead_hours,
        model=result.model_rmse,
        persistence=result.persistence_rmse,
        climatology=result.climatology_rmse,
        path=folder / "rmse_by_lead.png",
    )
    plot_forecast(run, *sample)
    if result.ensemble is not None:
        write_ensemble_plots(folder, result.ensemble, variables=result.variables, leads=result.leads)


def write_ensemble_plots(folder: Path, sums: EnsembleScoreSums, *, variables: list[str], leads: list[str]) -> None:
    """``rank_histogram.png`` (the last lead) and ``spread_skill.png`` (every lead) of an ensemble's scores."""
    scores = sums.as_arrays()
    plot_ensemble_scores(
        folder,
        rank_histogram=scores["rank_histogram"],
        spread=scores["spread"],
        rmse=scores["ensemble_mean_rmse"],
        variables=variables,
        leads=leads,
        lead_index=len(leads) - 1,
    )


def write_run_outputs(
    run: Run,
    *,
    step: int,
    result: ValidationResult,
    metrics: MetricsLog,
    seconds: float,
    sample: tuple[torch.Tensor, torch.Tensor] | None,
    training_checkpoint: Path,
) -> RunOutputs:
    """Write the inference checkpoint, the validation table and the plots; log the summary (rank 0 only)."""
    folder = run.placement.run_dir
    inference_path = folder / INFERENCE_FILE
    save_inference_checkpoint(
        inference_path, model=run.model, config=run.config, roles=run.data.roles, normalizer=run.data.normalizer,
        graph=run.graph, variables_metadata=run.data.roles.metadata(run.data.store.attrs),
    )  # fmt: skip
    table = result.table()
    (folder / "validation.md").write_text(table + "\n")
    plots = run.config.diagnostics.plots
    if plots:
        write_plots(run, result, metrics, sample)
    peak = peak_rss_mib()
    LOG.info(
        "trained to step %d in %.0f s, peak memory %s MiB\nvalidation (%d samples):\n%s\n%s\n"
        "outputs in %s: inference.pt, checkpoints/last.pt, metrics.jsonl, validation.md%s",
        step,
        seconds,
        "n/a" if peak is None else f"{peak:.0f}",
        result.num_samples,
        table,
        "model beats persistence on every prognostic variable at the first lead time"
        if result.beats_persistence()
        else "model does NOT beat persistence on every prognostic variable yet",
        folder,
        (", loss_curve.png, rmse_by_lead.png, forecast_map.png" if plots else "")
        + (f", {REGION_MAP}" if plots and result.parts else "")
        + (", rank_histogram.png, spread_skill.png" if plots and result.ensemble is not None else ""),
    )
    return RunOutputs(folder, training_checkpoint, inference_path, metrics.path, result)

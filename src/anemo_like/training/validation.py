"""Validation: area-weighted RMSE per variable and lead time in physical units, beside persistence and climatology."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from anemo_like.data.zarr_store import format_frequency
from anemo_like.models.rollout import ForecastSpec, rollout
from anemo_like.progress import Progress
from anemo_like.training.ensemble import VALIDATION_STREAM, EnsembleMembers
from anemo_like.training.ensemble_scores import EnsembleScoreSums


@dataclass
class ValidationResult:
    """RMSE tables (lead, variable) in physical units; persistence only for prognostic variables."""

    variables: list[str]
    leads: list[str]  # lead times, e.g. "6h", "30m", "1d"
    lead_hours: list[float]  # the same lead times in hours
    model_rmse: np.ndarray  # (L, V)
    persistence_rmse: np.ndarray  # (L, P), P = number of prognostic variables
    climatology_rmse: np.ndarray | None  # (L, V), the training dates' mean state as the forecast
    loss: float
    num_samples: int  # start dates scored
    ensemble: EnsembleScoreSums | None = None  # probabilistic scores of an ensemble (model_rmse: its mean's)

    def table(self) -> str:
        """Markdown table: variable, lead, model RMSE, persistence RMSE, ratio, climatology RMSE."""
        lines = [
            "| variable | lead | model RMSE | persistence RMSE | model / persistence | climatology RMSE |",
            "|---|---|---|---|---|---|",
        ]
        num_prognostic = self.persistence_rmse.shape[1]
        for v, name in enumerate(self.variables):
            for li, lead in enumerate(self.leads):
                model = self.model_rmse[li, v]
                climatology = "n/a" if self.climatology_rmse is None else f"{self.climatology_rmse[li, v]:.4g}"
                if v < num_prognostic:
                    pers = self.persistence_rmse[li, v]
                    lines.append(f"| {name} | {lead} | {model:.4g} | {pers:.4g} | {model / pers:.3f} | {climatology} |")
                else:
                    lines.append(f"| {name} | {lead} | {model:.4g} | n/a | n/a | {climatology} |")
        if self.ensemble is not None:
            lines += ["", ensemble_table(self.ensemble, variables=self.variables, leads=self.leads)]
        return "\n".join(lines)

    def beats_persistence(self, lead_index: int = 0) -> bool:
        num_prognostic = self.persistence_rmse.shape[1]
        return bool(np.all(self.model_rmse[lead_index, :num_prognostic] < self.persistence_rmse[lead_index]))

    def as_record(self) -> dict[str, float]:
        record = {"val_loss": self.loss}
        for li, lead in enumerate(self.leads):
            for v, name in enumerate(self.variables):
                record[f"rmse_{name}_{lead}"] = float(self.model_rmse[li, v])
        if self.ensemble is not None:
            record |= self.ensemble.records(variables=self.variables, leads=self.leads)
        return record


def ensemble_table(sums: EnsembleScoreSums, *, variables: list[str], leads: list[str]) -> str:
    """Markdown table: variable, lead, fair CRPS, ensemble-mean RMSE, spread, spread/skill (physical units)."""
    scores = sums.as_arrays()
    lines = [
        f"Ensemble of {sums.num_members} members:",
        "",
        "| variable | lead | CRPS | ensemble-mean RMSE | spread | spread / skill |",
        "|---|---|---|---|---|---|",
    ]
    for v, name in enumerate(variables):
        for li, lead in enumerate(leads):
            row = [scores[key][li, v] for key in ("crps", "ensemble_mean_rmse", "spread", "spread_skill")]
            lines.append(f"| {name} | {lead} | {row[0]:.4g} | {row[1]:.4g} | {row[2]:.4g} | {row[3]:.3f} |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Scoring:
    """What validation scores: ``output_names`` (V_out) with their physical ``output_scale`` (V_out,; offsets cancel
    in differences), grid ``area_weight`` (G,), the model step, the training loss, and a ``climatology`` (G, V_out,
    normalised) scored as a forecast too (None: no climatology column)."""

    output_names: list[str]
    output_scale: np.ndarray
    area_weight: torch.Tensor
    step_length: datetime.timedelta
    loss_fn: nn.Module
    climatology: np.ndarray | None = None


class _ErrorSums:
    """Area-weighted squared errors (float64, physical units) and the weight of the points that had a target, per
    lead and variable, for the model, persistence and climatology; and the loss."""

    def __init__(
        self, scoring: Scoring, *, steps: int, num_prognostic: int, device: torch.device, members: int = 1
    ) -> None:
        self.steps, self.num_prognostic, self.loss_fn = steps, num_prognostic, scoring.loss_fn
        self.ensemble = None
        if members > 1:
            self.ensemble = EnsembleScoreSums.zeros(
                num_leads=steps, num_variables=len(scoring.output_names), num_members=members
            )
        self.weight = (scoring.area_weight / scoring.area_weight.sum()).to(device).double()
        self.scale = torch.as_tensor(scoring.output_scale, dtype=torch.float64, device=device)
        clim = scoring.climatology
        self.clim = None if clim is None else torch.as_tensor(clim, dtype=torch.float32, device=device)
        self.model = torch.zeros(steps, len(scoring.output_names), dtype=torch.float64, device=device)
        self.persistence = torch.zeros(steps, num_prognostic, dtype=torch.float64, device=device)
        self.model_weight, self.persistence_weight = torch.zeros_like(self.model), torch.zeros_like(self.persistence)
        self.climatology = torch.zeros_like(self.model)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)

    def _weighted(self, values: torch.Tensor) -> torch.Tensor:
        return torch.einsum("g,bgv->v", self.weight, values)

    def add(self, step: int, prediction: torch.Tensor, target: torch.Tensor, last_state: torch.Tensor) -> None:
        """One lead of a batch: prediction (B, G, V_out), or members (B, M, G, V_out) of an ensemble, target (B, G,
        V_out), last input state (B, G, P), all normalised. An ensemble's RMSE is its mean's."""
        p = self.num_prognostic
        self.loss += self.loss_fn(prediction, target) * target.shape[0] / self.steps
        if self.ensemble is not None:
            self.ensemble.add(step, prediction.double() * self.scale, target.double() * self.scale, self.weight)
            prediction = prediction.mean(1)
        valid = target.isfinite()
        err = torch.where(valid, prediction - target, 0.0).double() * self.scale
        self.model[step] += self._weighted(err.square())
        if self.clim is not None:
            err_clim = torch.where(valid, self.clim - target, 0.0).double() * self.scale
            self.climatology[step] += self._weighted(err_clim.square())
        self.model_weight[step] += self._weighted(valid.double())
        pers = torch.where(valid[..., :p], last_state - target[..., :p], 0.0)
        self.persistence[step] += self._weighted((pers.double() * self.scale[:p]).square())
        self.persistence_weight[step] += self._weighted(valid[..., :p].double())

    def result(self, scoring: Scoring, samples: int) -> ValidationResult:
        length = scoring.step_length
        climatology = None if self.clim is None else np.sqrt((self.climatology / self.model_weight).cpu().numpy())
        return ValidationResult(
            variables=scoring.output_names,
            leads=[format_frequency(length * (s + 1)) for s in range(self.steps)],
            lead_hours=[(length * (s + 1)).total_seconds() / 3600 for s in range(self.steps)],
            model_rmse=np.sqrt((self.model / self.model_weight).cpu().numpy()),
            persistence_rmse=np.sqrt((self.persistence / self.persistence_weight).cpu().numpy()),
            climatology_rmse=climatology,
            loss=float(self.loss) / samples,
            num_samples=samples,
            ensemble=self.ensemble,
        )


@torch.no_grad()
def validate(
    model: nn.Module,
    loader: DataLoader,
    *,
    spec: ForecastSpec,
    scoring: Scoring,
    steps: int,
    device: torch.device,
    limit_batches: int | None = None,
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
    progress: bool = False,
    members: int = 1,
    seed: int = 0,
    initial_members: int = 1,
) -> ValidationResult:
    """Score ``steps`` autoregressive steps on every validation sample (at most ``limit_batches`` batches).

    Non-finite targets (``data.nan_policy: mask``) are left out: each RMSE is over the points that have a target.
    ``prepare`` makes a loader batch ready on ``device`` (default: a copy there); ``autocast`` wraps the forward.
    ``progress`` shows the batches done (:mod:`anemo_like.progress`). ``members`` > 1 runs that many ensemble
    members per sample (processor noise from ``seed`` and the batch index: the same at every validation), from
    the initial states of ``initial_members`` dataset members (:meth:`EnsembleMembers.expand`).
    """
    was_training = model.training
    model.eval()
    sums = _ErrorSums(scoring, steps=steps, num_prognostic=spec.num_prognostic, device=device, members=members)
    ensemble = None
    if members > 1:
        ensemble = EnsembleMembers.of(
            members=members, group=None, rank=0, size=1, seed=seed, initial_members=initial_members
        )
    prognostic_inputs = torch.as_tensor(spec.input_positions, device=device)[: spec.num_prognostic]
    samples = 0
    total = len(loader) if limit_batches is None else min(len(loader), limit_batches)
    with Progress(total=total, desc="validation", unit="batch", enabled=progress, leave=False) as shown:
        for i, batch in enumerate(loader):
            if i >= total:
                break
            batch = batch.to(device) if prepare is None else prepare(batch)
            last_state = batch[:, spec.multistep - 1].index_select(-1, prognostic_inputs).float()
            with autocast():
                predictions = list(_rollout(model, batch, spec, steps=steps, ensemble=ensemble, index=i))
            for step, (prediction, target) in enumerate(predictions):
                sums.add(step, prediction.float(), target.float(), last_state)
            samples += batch.shape[0]
            shown.update()
    model.train(was_training)
    if samples == 0:
        raise ValueError("validation saw no samples: check data.splits.val and dataloader.limit_batches.val")
    return sums.result(scoring, samples)


def _rollout(
    model: nn.Module,
    batch: torch.Tensor,
    spec: ForecastSpec,
    *,
    steps: int,
    ensemble: EnsembleMembers | None,
    index: int,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(prediction (B, G, V), target) per lead, or (members (B, M, G, V), target) for an ``ensemble``."""
    if ensemble is None:
        yield from rollout(model, batch, spec, steps=steps)
        return
    noise = ensemble.noise(model.noise_shape(batch.shape[0]), stream=VALIDATION_STREAM, step=index, device=batch.device)
    for prediction, target in rollout(model, ensemble.expand(batch, spec.multistep), spec, steps=steps, noise=noise):
        yield ensemble.gather(prediction), ensemble.target(target)

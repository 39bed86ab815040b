"""Validation: area-weighted RMSE per variable and lead time in physical units, beside persistence and climatology;
also for the region and the rest of a combined dataset, and over the interior only of a limited-area one."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from anemo_like.data.zarr_store import format_frequency
from anemo_like.models.member_noise import VALIDATION_STREAM
from anemo_like.models.rollout import ForecastSpec, rollout
from anemo_like.progress import Progress
from anemo_like.scoring.ensemble_scores import EnsembleScoreSums
from anemo_like.scoring.score_areas import ScoreAreas
from anemo_like.training.ensemble import EnsembleMembers


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
    parts: dict[str, PartRMSE] = field(default_factory=dict)  # "region", "rest" of a dataset with a region mask
    note: str = ""  # which points are scored, when not all of them (a limited-area dataset's interior)

    def table(self) -> str:
        """Markdown table: variable, lead, model RMSE, persistence RMSE, ratio, climatology RMSE; then the parts'
        table side by side (:func:`parts_table`) and an ensemble's; ``note`` first when there is one."""
        lines = [self.note, ""] if self.note else []
        lines += [
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
        if self.parts:
            lines += ["", parts_table(self.parts, variables=self.variables, leads=self.leads)]
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
                for part, scores in self.parts.items():
                    record[f"rmse_{part}_{name}_{lead}"] = float(scores.model[li, v])
        if self.ensemble is not None:
            record |= self.ensemble.records(variables=self.variables, leads=self.leads)
        return record


@dataclass(frozen=True, kw_only=True)
class PartRMSE:
    """RMSE tables of one part of the grid (the region, the rest), physical units."""

    model: np.ndarray  # (L, V)
    persistence: np.ndarray  # (L, P)
    climatology: np.ndarray | None  # (L, V)


def parts_table(parts: dict[str, PartRMSE], *, variables: list[str], leads: list[str]) -> str:
    """Markdown table: variable, lead, then model RMSE, persistence RMSE, model / persistence and climatology RMSE,
    each for every part side by side (e.g. region | rest)."""
    names = list(parts)
    kinds = ["model RMSE", "persistence RMSE", "model / persistence", "climatology RMSE"]
    header = ["variable", "lead", *(f"{name} {kind}" for kind in kinds for name in names)]
    lines = [
        f"By part of the grid: {', '.join(names)}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for v, variable in enumerate(variables):
        for li, lead in enumerate(leads):
            columns = [_part_cells(parts[name], li, v) for name in names]
            cells = [variable, lead, *(column[k] for k in range(len(kinds)) for column in columns)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _part_cells(part: PartRMSE, lead: int, variable: int) -> list[str]:
    """A part's model RMSE, persistence RMSE, their ratio and climatology RMSE (n/a where there is none)."""
    model = part.model[lead, variable]
    persistence = part.persistence[lead, variable] if variable < part.persistence.shape[1] else np.nan
    climatology = np.nan if part.climatology is None else part.climatology[lead, variable]
    ratio = model / persistence if np.isfinite(persistence) and persistence > 0 else np.nan
    return [_cell(model), _cell(persistence), "n/a" if not np.isfinite(ratio) else f"{ratio:.3f}", _cell(climatology)]


def _cell(value: float) -> str:
    return "n/a" if not np.isfinite(value) else f"{value:.4g}"


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
    areas: ScoreAreas | None = None  # the points scored and the parts (region, rest); None: the whole grid

    def weights(self) -> np.ndarray:
        """(K, G) float64 point weights, each row summing to 1: the scored points, then each part of ``areas``."""
        areas = self.areas or ScoreAreas.whole(self.area_weight.numel())
        return areas.weights(self.area_weight.double().cpu().numpy())


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
        self.weights = torch.as_tensor(scoring.weights(), device=device)  # (K, G): scored points, then the parts
        self.weight = self.weights[0]
        self.scale = torch.as_tensor(scoring.output_scale, dtype=torch.float64, device=device)
        clim = scoring.climatology
        self.clim = None if clim is None else torch.as_tensor(clim, dtype=torch.float32, device=device)
        sums = (len(self.weights), steps)
        self.model = torch.zeros(*sums, len(scoring.output_names), dtype=torch.float64, device=device)
        self.persistence = torch.zeros(*sums, num_prognostic, dtype=torch.float64, device=device)
        self.model_weight, self.persistence_weight = torch.zeros_like(self.model), torch.zeros_like(self.persistence)
        self.climatology = torch.zeros_like(self.model)
        self.loss = torch.zeros((), dtype=torch.float64, device=device)

    def _weighted(self, values: torch.Tensor) -> torch.Tensor:
        """(B, G, V) -> (K, V): the weighted sums over batch and grid with each row of the point weights."""
        return torch.einsum("kg,bgv->kv", self.weights, values)

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
        self.model[:, step] += self._weighted(err.square())
        if self.clim is not None:
            err_clim = torch.where(valid, self.clim - target, 0.0).double() * self.scale
            self.climatology[:, step] += self._weighted(err_clim.square())
        self.model_weight[:, step] += self._weighted(valid.double())
        pers = torch.where(valid[..., :p], last_state - target[..., :p], 0.0)
        self.persistence[:, step] += self._weighted((pers.double() * self.scale[:p]).square())
        self.persistence_weight[:, step] += self._weighted(valid[..., :p].double())

    def _rmse(self) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """(K, L, V) model, (K, L, P) persistence and (K, L, V) climatology (None: not scored) RMSE."""
        with np.errstate(invalid="ignore", divide="ignore"):
            model = np.sqrt((self.model / self.model_weight).cpu().numpy())
            persistence = np.sqrt((self.persistence / self.persistence_weight).cpu().numpy())
            climatology = None if self.clim is None else np.sqrt((self.climatology / self.model_weight).cpu().numpy())
        return model, persistence, climatology

    def result(self, scoring: Scoring, samples: int) -> ValidationResult:
        length = scoring.step_length
        model, persistence, climatology = self._rmse()
        areas = scoring.areas or ScoreAreas.whole(scoring.area_weight.numel())
        parts = {
            name: PartRMSE(
                model=model[k], persistence=persistence[k], climatology=None if climatology is None else climatology[k]
            )
            for k, name in enumerate(areas.names, start=1)
        }
        return ValidationResult(
            variables=scoring.output_names,
            leads=[format_frequency(length * (s + 1)) for s in range(self.steps)],
            lead_hours=[(length * (s + 1)).total_seconds() / 3600 for s in range(self.steps)],
            model_rmse=model[0],
            persistence_rmse=persistence[0],
            climatology_rmse=None if climatology is None else climatology[0],
            loss=float(self.loss) / samples,
            num_samples=samples,
            ensemble=self.ensemble,
            parts=parts,
            note=areas.note(),
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

"""Validation: area-weighted RMSE per variable and lead time in physical units, beside persistence and climatology."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from anemo_like.data.zarr_store import format_frequency
from anemo_like.training.rollout import rollout


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
        return "\n".join(lines)

    def beats_persistence(self, lead_index: int = 0) -> bool:
        num_prognostic = self.persistence_rmse.shape[1]
        return bool(np.all(self.model_rmse[lead_index, :num_prognostic] < self.persistence_rmse[lead_index]))

    def as_record(self) -> dict[str, float]:
        record = {"val_loss": self.loss}
        for li, lead in enumerate(self.leads):
            for v, name in enumerate(self.variables):
                record[f"rmse_{name}_{lead}"] = float(self.model_rmse[li, v])
        return record


@torch.no_grad()
def validate(
    model: nn.Module,
    loader: DataLoader,
    *,
    loss_fn: nn.Module,
    multistep: int,
    steps: int,
    step_length: datetime.timedelta,
    input_positions: list[int],
    output_positions: list[int],
    output_names: list[str],
    num_prognostic: int,
    output_scale: np.ndarray,
    area_weight: torch.Tensor,
    device: torch.device,
    climatology: np.ndarray | None = None,
    limit_batches: int | None = None,
    prepare: Callable[[torch.Tensor], torch.Tensor] | None = None,
    autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
) -> ValidationResult:
    """Score ``steps`` autoregressive steps on every validation sample.

    ``output_scale`` (V_out,) turns normalised errors into physical units (offsets cancel in differences).
    ``climatology`` (G, V_out), normalised, is scored as a forecast too.
    Non-finite targets (``data.nan_policy: mask``) are left out: each RMSE is over the points that have a target.
    ``prepare`` makes a loader batch ready on ``device`` (default: a copy there); ``autocast`` wraps the forward.
    """
    was_training = model.training
    model.eval()
    weight = (area_weight / area_weight.sum()).to(device)
    scale = torch.as_tensor(output_scale, dtype=torch.float64, device=device)
    prognostic_inputs = torch.as_tensor(input_positions[:num_prognostic], device=device)
    sq_model = torch.zeros(steps, len(output_positions), dtype=torch.float64, device=device)
    sq_pers = torch.zeros(steps, num_prognostic, dtype=torch.float64, device=device)
    weight_model, weight_pers = torch.zeros_like(sq_model), torch.zeros_like(sq_pers)
    sq_clim = torch.zeros_like(sq_model)
    clim = None if climatology is None else torch.as_tensor(climatology, dtype=torch.float32, device=device)
    loss_sum, samples = torch.zeros((), dtype=torch.float64, device=device), 0
    for i, batch in enumerate(loader):
        if limit_batches is not None and i >= limit_batches:
            break
        batch = batch.to(device) if prepare is None else prepare(batch)
        last_state = batch[:, multistep - 1].index_select(-1, prognostic_inputs).float()
        with autocast():
            predictions = list(
                rollout(
                    model,
                    batch,
                    multistep=multistep,
                    steps=steps,
                    input_positions=input_positions,
                    output_positions=output_positions,
                    num_prognostic=num_prognostic,
                )
            )
        for step, (prediction, target) in enumerate(predictions):
            prediction, target = prediction.float(), target.float()
            loss_sum += loss_fn(prediction, target) * batch.shape[0] / steps
            valid = target.isfinite()
            err = torch.where(valid, prediction - target, 0.0).double() * scale
            sq_model[step] += torch.einsum("g,bgv->v", weight.double(), err.square())
            if clim is not None:
                err_clim = torch.where(valid, clim - target, 0.0).double() * scale
                sq_clim[step] += torch.einsum("g,bgv->v", weight.double(), err_clim.square())
            weight_model[step] += torch.einsum("g,bgv->v", weight.double(), valid.double())
            pers = torch.where(valid[..., :num_prognostic], last_state - target[..., :num_prognostic], 0.0)
            sq_pers[step] += torch.einsum(
                "g,bgv->v", weight.double(), (pers.double() * scale[:num_prognostic]).square()
            )
            weight_pers[step] += torch.einsum("g,bgv->v", weight.double(), valid[..., :num_prognostic].double())
        samples += batch.shape[0]
    model.train(was_training)
    if samples == 0:
        raise ValueError("validation saw no samples: check data.splits.val and dataloader.limit_batches.val")
    return ValidationResult(
        variables=output_names,
        leads=[format_frequency(step_length * (s + 1)) for s in range(steps)],
        lead_hours=[(step_length * (s + 1)).total_seconds() / 3600 for s in range(steps)],
        model_rmse=np.sqrt((sq_model / weight_model).cpu().numpy()),
        persistence_rmse=np.sqrt((sq_pers / weight_pers).cpu().numpy()),
        climatology_rmse=None if clim is None else np.sqrt((sq_clim / weight_model).cpu().numpy()),
        loss=float(loss_sum) / samples,
        num_samples=samples,
    )

"""Autoregressive forecasts from the initial dates: the training rollout, timed and memory-logged step by step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from anemo_like.data.zarr_store import format_frequency
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.models.rollout import ForecastSpec, rollout
from anemo_like.progress import Progress
from anemo_like.runtime.process_memory import current_rss_mib, peak_memory_mib, reset_peak_rss

LOG = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def memory_in_use_mib(device: torch.device) -> float | None:
    """Memory in use now, MiB: CUDA allocated on a GPU (the context excluded), else the process's resident size
    (VmRSS: interpreter, imported libraries and heap included)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return current_rss_mib()


def start_memory_mib(device: torch.device) -> float | None:
    """Reset the peak counter and return the memory in use now, MiB (CUDA allocated, else resident)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return memory_in_use_mib(device)
    return current_rss_mib() if reset_peak_rss() else None


def format_mib(mib: float | None) -> str:
    return "n/a" if mib is None else f"{mib:.0f} MiB"


@dataclass(frozen=True, kw_only=True)
class ForecastStats:
    """Totals of one run of :func:`run_forecasts`."""

    seconds: float  # wall time, reading inputs included
    step_seconds: float  # model steps only
    forecasts: int
    steps: int  # per forecast
    peak_mib: float | None
    start_mib: float | None  # in use when the forecasts started: the loaded model, dataset handles, ...

    @property
    def forecast_peak_mib(self) -> float | None:
        """What the forecasts added on top of ``start_mib`` at their peak (where the peak could be reset)."""
        return None if self.peak_mib is None or self.start_mib is None else self.peak_mib - self.start_mib


def _log_step(label: str, step: int, inputs: ForecastInputs, seconds: float, device: torch.device) -> None:
    LOG.debug(
        "forecast %s step %d/%d (+%s): %.3f s, peak memory %s",
        label,
        step + 1,
        inputs.steps,
        format_frequency(inputs.step * (step + 1)),
        seconds,
        format_mib(peak_memory_mib(device)),
    )


def _read_windows(inputs: ForecastInputs, init_indices: np.ndarray, grid: slice) -> np.ndarray:
    """The input windows of ``init_indices`` (B,), (B, T, g, V_in) float32, each written in place (no stacked copy)."""
    times, variables = inputs.window_shape
    points = len(range(*grid.indices(inputs.store.shape[-1])))
    windows = np.empty((len(init_indices), times, points, variables), np.float32)
    for window, index in zip(windows, init_indices, strict=True):
        inputs.window(int(index), grid, out=window)
    return windows


def _forecast_spec(inputs: ForecastInputs) -> ForecastSpec:
    """The rollout's view of a forecast window: the inputs in order, the prognostic variables as (unknown) targets."""
    num_prognostic = len(inputs.roles.prognostic)
    return ForecastSpec(
        multistep=inputs.multistep,
        input_positions=list(range(len(inputs.roles.input))),
        output_positions=list(range(num_prognostic)),  # the targets: unknown (NaN) here, ignored
        num_prognostic=num_prognostic,
        output_steps=inputs.output_steps,
    )


@torch.inference_mode()
def run_forecasts(
    model: nn.Module,
    inputs: ForecastInputs,
    *,
    device: torch.device,
    dtype: torch.dtype,
    batch_size: int,
    grid: slice = slice(None),
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, ForecastStats]:
    """Forecasts (N, L, G, V_out) float32 in physical units from the N initial dates, L = ``inputs.steps``.

    Each step feeds the predicted prognostic variables back, with the forcings of the new valid time; diagnostic
    outputs are never fed back. ``model`` (on ``device``, in ``dtype``) gets its inputs in ``dtype``. A sharded
    model's ranks read their ``grid`` block of the inputs and ``gather`` the blocks on the device, (B, T, g, V) ->
    (B, T, G, V), only for the times each step reads (the rollout's ``gather``). ``progress`` shows the steps done
    (:mod:`anemo_like.progress`; each step's time and peak memory are logged at DEBUG level). A model of
    ``inputs.output_steps`` = K > 1 predicts K steps per forward pass: the first step of each pass takes its time,
    the other K - 1 are read from its output.
    """
    roles = inputs.roles
    init_indices = inputs.init_indices
    out = inputs.output_normalizer
    forecasts = np.empty((len(init_indices), inputs.steps, inputs.store.shape[-1], len(roles.output)), np.float32)
    start_mib = start_memory_mib(device)
    started = time.perf_counter()
    step_seconds = 0.0
    spec = _forecast_spec(inputs).on(device)
    with Progress(len(init_indices) * inputs.steps, desc="forecast", unit="step", enabled=progress) as bar:
        for first in range(0, len(init_indices), batch_size):
            chunk = init_indices[first : first + batch_size]
            batch = torch.from_numpy(_read_windows(inputs, chunk, grid)).to(device, dtype)
            label = str(inputs.store.dates[chunk[0]]) + (f" (+{len(chunk) - 1} more)" if len(chunk) > 1 else "")
            predictions = rollout(model, batch, spec, steps=inputs.steps, gather=gather)
            for step in range(inputs.steps):
                clock = time.perf_counter()
                prediction, _ = next(predictions)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds = time.perf_counter() - clock
                step_seconds += seconds
                values = prediction.float().cpu().numpy()  # (B, G, V_out) normalised
                forecasts[first : first + len(chunk), step] = out.denormalize(values, axis=-1)
                _log_step(label, step, inputs, seconds, device)
                lead = format_frequency(inputs.step * (step + 1))
                bar.update(len(chunk), date=label, lead=lead, memory=format_mib(peak_memory_mib(device)))
    stats = ForecastStats(
        seconds=time.perf_counter() - started,
        step_seconds=step_seconds,
        forecasts=len(init_indices),
        steps=inputs.steps,
        peak_mib=peak_memory_mib(device),
        start_mib=start_mib,
    )
    return forecasts, stats

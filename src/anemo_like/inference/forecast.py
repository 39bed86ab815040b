"""Autoregressive forecasts from the initial dates: the training rollout, timed and memory-logged step by step."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from anemo_like.data.zarr_store import format_frequency
from anemo_like.inference.captured_forward import CapturedForward
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.member_noise import INFERENCE_STREAM, member_noise, member_seed
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
    forecasts: int  # initial dates
    members: int  # forecasts per initial date
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


def _member_batch(
    inputs: ForecastInputs, dates: np.ndarray, grid: slice, device: torch.device, dtype: torch.dtype
) -> Tensor:
    """The input windows (R, T, g, V_in) of R forecast rows whose initial dates are ``inputs.init_indices[dates]``
    (R,), in ``dtype`` on ``device``: each date read once, repeated on the device for its members."""
    unique, where = np.unique(dates, return_inverse=True)
    batch = torch.from_numpy(_read_windows(inputs, inputs.init_indices[unique], grid)).to(device, dtype)
    return batch if len(unique) == len(dates) else batch[torch.from_numpy(where).to(device)]


def _member_noise(
    model: ForecastModel, init_indices: np.ndarray, members: np.ndarray, *, seed: int, device: torch.device
) -> Callable[[int], Tensor] | None:
    """Processor noise of R forecast rows, (R, N_hidden, D) per forward pass: row r draws from its own generator,
    seeded by (``seed``, the inference stream, the dataset index ``init_indices[r]`` of its initial date, its member
    ``members[r]``), so a member does not depend on the batch or the rank that runs it. None: deterministic model."""
    seeds = [member_seed(seed, INFERENCE_STREAM, int(i), int(k)) for i, k in zip(init_indices, members, strict=True)]
    return member_noise(model.noise_shape(1), seeds=seeds, device=device)


def _forecast_spec(inputs: ForecastInputs) -> ForecastSpec:
    """The rollout's view of a forecast window: the inputs in order, the prognostic variables as (unknown) targets."""
    num_prognostic = len(inputs.roles.prognostic)
    return ForecastSpec(
        multistep=inputs.multistep,
        input_positions=list(range(len(inputs.roles.input))),
        output_positions=list(range(num_prognostic)),  # the targets: unknown (NaN) here, ignored
        num_prognostic=num_prognostic,
        output_steps=inputs.output_steps,
        forced=None if inputs.boundary is None else torch.from_numpy(inputs.boundary.forced),
    )


@torch.inference_mode()
def run_forecasts(
    model: ForecastModel,
    inputs: ForecastInputs,
    *,
    device: torch.device,
    dtype: torch.dtype,
    batch_size: int,
    members: int = 1,
    seed: int = 0,
    grid: slice = slice(None),
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool = False,
    cuda_graphs: bool = False,
) -> tuple[np.ndarray, ForecastStats]:
    """Forecasts (N, M, L, G, V_out) float32 in physical units: ``members`` = M from each of the N initial dates,
    L = ``inputs.steps``.

    Each step feeds the predicted prognostic variables back, with the forcings of the new valid time; diagnostic
    outputs are never fed back. The N * M forecasts (date-major) run ``batch_size`` at a time; member k of the
    initial date of dataset index i draws its processor noise from ``member_seed(seed, 2, i, k)``
    (:func:`_member_noise`), the same on every rank. ``model`` (on ``device``, in ``dtype``) gets its inputs in
    ``dtype``. A sharded model's ranks read their ``grid`` block of the inputs and ``gather`` the blocks on the
    device, (B, T, g, V) -> (B, T, G, V), only for the times each step reads (the rollout's ``gather``).
    ``progress`` shows the steps done (:mod:`anemo_like.progress`; each step's time and peak memory are logged at
    DEBUG level). A model of ``inputs.output_steps`` = K > 1 predicts K steps per forward pass: the first step of
    each pass takes its time, the other K - 1 are read from its output.
    """
    init_indices, out = inputs.init_indices, inputs.output_normalizer
    shape = (len(init_indices), members, inputs.steps, inputs.store.shape[-1], len(inputs.roles.output))
    forecasts = np.empty(shape, np.float32)
    start_mib = start_memory_mib(device)
    started = time.perf_counter()
    step_seconds = 0.0
    spec = _forecast_spec(inputs).on(device)
    rows = len(init_indices) * members
    forward = CapturedForward(model) if cuda_graphs else model
    with Progress(rows * inputs.steps, desc="forecast", unit="step", enabled=progress) as bar:
        for first in range(0, rows, batch_size):
            dates, member = np.divmod(np.arange(first, min(first + batch_size, rows)), members)
            batch = _member_batch(inputs, dates, grid, device, dtype)
            noise = _member_noise(model, init_indices[dates], member, seed=seed, device=device)
            predictions = rollout(forward, batch, spec, steps=inputs.steps, gather=gather, noise=noise)
            label = _batch_label(inputs, dates, member, members)
            for step in range(inputs.steps):
                prediction, seconds = _timed_step(predictions, device)
                step_seconds += seconds
                values = prediction.float().cpu().numpy()  # (R, G, V_out) normalised
                forecasts[dates, member, step] = out.denormalize(values, axis=-1)
                _write_forced(forecasts, inputs, dates, member, step)
                _log_step(label, step, inputs, seconds, device)
                lead = format_frequency(inputs.step * (step + 1))
                bar.update(len(dates), date=label, lead=lead, memory=format_mib(peak_memory_mib(device)))
    stats = ForecastStats(
        seconds=time.perf_counter() - started, step_seconds=step_seconds, forecasts=len(init_indices),
        members=members, steps=inputs.steps, peak_mib=peak_memory_mib(device), start_mib=start_mib,
    )  # fmt: skip
    return forecasts, stats


def _write_forced(
    forecasts: np.ndarray, inputs: ForecastInputs, dates: np.ndarray, member: np.ndarray, step: int
) -> None:
    """The forced values of the boundary points, exactly as given (not through normalisation and back), into
    ``forecasts`` (N, M, L, G, V_out) at lead ``step`` of the rows (``dates``, ``member``); nothing without one."""
    if inputs.boundary is None:
        return
    forced, count = np.flatnonzero(inputs.boundary.forced), len(inputs.roles.prognostic)
    lead = (step + 1) * np.timedelta64(int(inputs.step.total_seconds()), "s")
    for date in np.unique(dates):
        init = inputs.init_dates[date]
        values = inputs.boundary.physical(init, init + lead).T  # (g_forced, V_prognostic)
        for k in member[dates == date]:
            forecasts[date, k, step, forced, :count] = values


def _timed_step(predictions: Iterator[tuple[Tensor, Tensor]], device: torch.device) -> tuple[Tensor, float]:
    """The rollout's next prediction and the seconds it took (on a GPU: until the device finished)."""
    clock = time.perf_counter()
    prediction, _ = next(predictions)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return prediction, time.perf_counter() - clock


def _batch_label(inputs: ForecastInputs, dates: np.ndarray, member: np.ndarray, members: int) -> str:
    """The first forecast of a batch of rows (R,) for the log: its initial date, its member, how many more."""
    label = str(inputs.store.dates[inputs.init_indices[dates[0]]])
    if members > 1:
        label += f" member {member[0]}"
    return label + (f" (+{len(dates) - 1} more)" if len(dates) > 1 else "")

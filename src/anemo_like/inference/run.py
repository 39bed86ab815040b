"""One ``anemo-infer`` run: check everything that can be checked first, then forecast, write, verify."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import xarray as xr

from anemo_like.checkpoints.inference import InferenceBundle, load_inference_checkpoint
from anemo_like.config.inference import InferenceConfig
from anemo_like.data.zarr_store import AnemoiZarr, format_frequency, parse_frequency
from anemo_like.distributed.environment import launch_environment, rank_zero_value, select_device
from anemo_like.inference.captured_forward import cuda_graph_refusal
from anemo_like.inference.forecast import DTYPES, ForecastStats, format_mib, memory_in_use_mib, run_forecasts
from anemo_like.inference.forecast_plan import apply_forecast_plan, plan_forecast
from anemo_like.inference.grib_output import GribPlan, prepare_grib, write_grib
from anemo_like.inference.inputs import ForecastInputs, open_inputs, open_truth
from anemo_like.inference.memory_fit import check_forecasts_fit
from anemo_like.inference.output import (
    check_finite_forecasts,
    check_output,
    check_writable,
    forecast_dataset,
    write_forecast,
)
from anemo_like.inference.parallel import InferenceRanks, gather_forecasts, place_inference
from anemo_like.inference.scores import Verification
from anemo_like.inference.state_source import describe
from anemo_like.inference.verification import TABLE, VerificationRequest, training_climatology, verify_forecast
from anemo_like.interrupts import phase
from anemo_like.runtime.backends import check_backends
from anemo_like.runtime.heap_release import set_heap_release
from anemo_like.runtime.inference_environment import check_inference_environment
from anemo_like.runtime.process_memory import peak_memory_mib

LOG = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """A run that passed every check: the model is loaded and the inputs are known to exist."""

    config: InferenceConfig
    checkpoint: Path
    bundle: InferenceBundle
    inputs: ForecastInputs  # every initial date of the run
    truth: AnemoiZarr | None  # the dataset verify=true scores against (None: input files and no dataset opened)
    ranks: InferenceRanks
    device: torch.device
    output: Path
    grib: GribPlan | None  # a GRIB output's variables, grid and encoding; None for netCDF and zarr
    verification_output: Path
    plot_variable: str
    runtime_mib: float | None  # in use before the checkpoint load: the interpreter and imports (resident on CPU)


@dataclass(frozen=True, kw_only=True)
class InferenceOutputs:
    """What a run wrote."""

    forecast: Path
    verification: Verification | None  # None: verify=false, or no valid time in the dataset
    verification_output: Path | None


def _check_verification(config: InferenceConfig, inputs: ForecastInputs) -> str:
    """The plot variable, after checking the verification keys against the model; ValueError names the key."""
    outputs = inputs.roles.output
    name = config.verification.plot_variable or inputs.roles.prognostic[0]
    if name not in outputs:
        raise ValueError(f"verification.plot_variable '{name}' is not an output of the model; choose from {outputs}")
    lead = config.verification.plot_lead
    if lead is not None:
        delta = parse_frequency(lead, source="verification.plot_lead")
        if delta % inputs.step or delta > inputs.step * inputs.steps:
            raise ValueError(
                f"verification.plot_lead '{lead}' must be a multiple of the model step {format_frequency(inputs.step)} "
                f"up to lead_time {config.lead_time}"
            )
    return name


def _check_members(config: InferenceConfig, bundle: InferenceBundle, checkpoint: Path) -> None:
    """An ensemble needs a model with processor noise, and its statistics names must be free; ValueError names the
    key."""
    if config.members > 1 and bundle.model.noise_shape(1) is None:
        raise ValueError(
            f"members={config.members} needs a model with processor noise (trained with model.noise and "
            f"training.ensemble.members > 1), but checkpoint {checkpoint} holds a deterministic model; set members=1 "
            "or use an ensemble checkpoint"
        )
    outputs = bundle.roles.output
    taken = [f"{name}_{kind}" for name in outputs for kind in ("mean", "spread") if f"{name}_{kind}" in outputs]
    if config.ensemble_stats and taken:  # the statistics' names clash with the model's outputs
        raise ValueError(
            f"ensemble_stats=true writes {', '.join(taken)}, which the model already outputs; set ensemble_stats=false"
        )


def prepare(config: InferenceConfig, *, runtime_mib: float | None = None) -> PreparedRun:
    """Load the checkpoint and check it against the dataset, dates and output paths before any forecast runs.

    ``runtime_mib``: resident memory after the imports (before any process group), which the memory log lines of a
    CPU run count from; measured here when not given, and on a GPU the device memory allocated here. Every problem
    raises ValueError or FileNotFoundError with one message naming the file or key (exit 2).
    """
    check_inference_environment()  # a bad ANEMOI_INFERENCE_* variable fails here, not mid-run
    launch = launch_environment()
    output = Path(rank_zero_value(str(Path(config.output).expanduser().absolute()), launch))  # a timestamped default
    check_output(output, remove_stale=launch.rank == 0)
    verification_output = Path(config.verification.output or output.parent).expanduser().absolute()
    if config.verify:
        check_writable(verification_output / TABLE, key="verification.output")
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    device = select_device(config.device, launch.local_rank, key="device")
    if runtime_mib is None or device.type == "cuda":
        runtime_mib = memory_in_use_mib(device)
    checkpoint = Path(config.checkpoint).expanduser().absolute()
    bundle = load_inference_checkpoint(checkpoint, device=device)
    _check_members(config, bundle, checkpoint)
    check_backends(bundle.config.model, torch.device(device), DTYPES[config.precision])
    bundle.model.to(DTYPES[config.precision])
    if device.type == "cpu":  # as in training: chunked forwards return freed heap, which bounds the resident peak
        set_heap_release(bundle.config.system.hardware.release_cpu_heap_mib)
    ranks = place_inference(config, launch, model=bundle.model, trained=bundle.config)
    if config.cuda_graphs and (refusal := cuda_graph_refusal(bundle.config.model, device, ranks.groups.model_size)):
        raise ValueError(refusal)
    truth = open_truth(config, bundle.config)
    inputs = open_inputs(config, bundle=bundle, checkpoint=checkpoint, truth=truth)
    plot_variable = _check_verification(config, inputs)
    grib = prepare_grib(config, bundle=bundle, inputs=inputs, output=output, checkpoint=checkpoint, dataset=truth)
    if (plan := plan_forecast(config, bundle=bundle, inputs=inputs, ranks=ranks)) is not None:
        apply_forecast_plan(plan, bundle.model, checkpoint, config.memory_budget_gb)
    check_forecasts_fit(config, bundle=bundle, inputs=inputs, ranks=ranks, device=device)  # before they run
    LOG.info(
        "checkpoint %s: %d forecast(s) from %s to +%s (%d steps of %s) on %s, %s, %s", checkpoint,
        len(inputs.init_indices), inputs.init_dates[0], config.lead_time, inputs.steps, format_frequency(inputs.step),
        device, config.precision, describe(inputs.store),
    )  # fmt: skip
    return PreparedRun(
        config=config,
        checkpoint=checkpoint,
        bundle=bundle,
        inputs=inputs,
        truth=truth,
        ranks=ranks,
        device=device,
        output=output,
        grib=grib,
        verification_output=verification_output,
        plot_variable=plot_variable,
        runtime_mib=runtime_mib,
    )


def run(prepared: PreparedRun) -> InferenceOutputs | None:
    """Forecast this rank's share of the dates; on rank 0, gather every copy's forecasts, write the forecast file,
    log the summary line, then verify if asked (None on the other ranks)."""
    config, inputs, ranks = prepared.config, prepared.inputs, prepared.ranks
    grid, gather = ranks.input_block(inputs.store.shape[-1])
    setup_peak = peak_memory_mib(prepared.device)  # loading and placing the model (the forecasts reset the peak)
    with phase("the forecasts"):
        forecasts, stats = run_forecasts(
            prepared.bundle.model,
            ranks.share(inputs),
            device=prepared.device,
            dtype=DTYPES[config.precision],
            batch_size=config.batch_size,
            members=config.members,
            seed=config.seed,
            grid=grid,
            gather=gather,
            progress=ranks.launch.rank == 0,
            cuda_graphs=config.cuda_graphs,
        )
        peak = _largest(setup_peak, stats.peak_mib)
        LOG.info(
            "rank %d: peak memory %s (forecasts: +%s above the loaded model; run: +%s above the %s after imports)",
            ranks.launch.rank,
            format_mib(peak),
            format_mib(stats.forecast_peak_mib),
            format_mib(None if peak is None or prepared.runtime_mib is None else peak - prepared.runtime_mib),
            format_mib(prepared.runtime_mib),
        )
        forecasts = gather_forecasts(forecasts, ranks, len(inputs.init_indices))
    if forecasts is None:
        return None
    check_finite_forecasts(forecasts, inputs, checkpoint=prepared.checkpoint)
    dataset = forecast_dataset(
        forecasts,
        inputs,
        checkpoint=prepared.checkpoint,
        precision=config.precision,
        ensemble_stats=config.ensemble_stats,
    )
    with phase(f"the write of {prepared.output}"):
        if prepared.grib is None:
            write_forecast(dataset, prepared.output)
        else:
            write_grib(dataset, prepared.grib)
    _log_summary(stats, ranks, peak=peak, output=prepared.output)
    if not config.verify:
        return InferenceOutputs(forecast=prepared.output, verification=None, verification_output=None)
    with phase("verification", saved=lambda: f"the forecast {prepared.output} is written"):
        return _verify(prepared, dataset)


def _log_summary(stats: ForecastStats, ranks: InferenceRanks, *, peak: float | None, output: Path) -> None:
    """The run's summary line: forecasts (of model copy 0), their time per step, the peak memory, the file."""
    copies = f" on model copy 0 of {ranks.copies}" if ranks.copies > 1 else ""
    members = f" of {stats.members} members" if stats.members > 1 else ""
    LOG.info(
        "anemo-infer: %d forecast(s)%s%s x %d steps in %.1f s (%.3f s per forecast step), peak memory %s "
        "(forecasts: +%s above the loaded model); wrote %s",
        stats.forecasts,
        members,
        copies,
        stats.steps,
        stats.seconds,
        stats.step_seconds / (stats.forecasts * stats.members * stats.steps),
        format_mib(peak),
        format_mib(stats.forecast_peak_mib),
        output,
    )


def _largest(*values: float | None) -> float | None:
    """The largest known value (None when none is known)."""
    return max((v for v in values if v is not None), default=None)


def _verify(prepared: PreparedRun, dataset: xr.Dataset) -> InferenceOutputs:
    """Score ``dataset``, the forecast as written to ``prepared.output`` (in memory: any output format)."""
    config, inputs = prepared.config, prepared.inputs
    run_config, roles = prepared.bundle.config, inputs.roles
    result = verify_forecast(
        VerificationRequest(
            forecast=prepared.output,
            store=prepared.truth,
            initial=inputs.store,
            variables=roles.output,
            num_prognostic=len(roles.prognostic),
            area_weight=prepared.bundle.graph["data"].area_weight.numpy(),
            climatology=training_climatology(run_config, roles.output, max_dates=config.verification.climatology_dates),
            output=prepared.verification_output,
            plot_variable=prepared.plot_variable,
            plot_lead=config.verification.plot_lead,
        ),
        dataset,
    )
    if result is not None:
        LOG.info("verification (%s):\n%s", prepared.verification_output, result.table())
    return InferenceOutputs(
        forecast=prepared.output, verification=result, verification_output=prepared.verification_output
    )


def run_inference(config: InferenceConfig) -> InferenceOutputs:
    """``anemo-infer`` in-process: :func:`prepare`, then :func:`run`."""
    return run(prepare(config))

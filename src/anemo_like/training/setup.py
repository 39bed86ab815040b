"""Everything a training run is built from, set up in one fixed order by :func:`build_run`:
seed → launch and process groups (and the tracking sender) → data → graph → resolved config → model → parallelism →
optimizer.

The process group itself is opened by the command (``anemo-train``, ``anemo-bench``, ``anemo-profile``) before
this runs and closed by it afterwards.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import HeteroData

from anemo_like.checkpoints.weights import CheckpointWeights
from anemo_like.config.schema import ModelConfig, RunConfig
from anemo_like.data.point_masks import BOUNDARY, REGION, point_mask
from anemo_like.data.setup import DataSetup, setup_data
from anemo_like.distributed.environment import (
    LaunchEnvironment,
    main_rank_first,
    rank_zero_value,
)
from anemo_like.distributed.groups import ProcessGroups
from anemo_like.distributed.parallelize import Parallelized, parallelize
from anemo_like.graphs import graph_fingerprint, load_or_build_graph
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.ops.collectives import node_shard_bounds
from anemo_like.models.rollout import ForecastSpec
from anemo_like.runtime.backends import check_backends
from anemo_like.runtime.heap_release import set_heap_release
from anemo_like.runtime.inference_environment import apply_inference_overrides, check_inference_environment
from anemo_like.runtime.memory_plan import (
    MemoryPlan,
    apply_validation_chunks,
    check_chunks_fit_graph,
    choose_validation_chunks,
    count_parameters,
    device_memory_bytes,
    has_auto_settings,
    resolve_auto_settings,
)
from anemo_like.runtime.precision import PrecisionPlan, precision_plan
from anemo_like.runtime.process_memory import current_memory_mib, peak_memory_mib
from anemo_like.tracking.background import SenderProcess
from anemo_like.tracking.tracker import Tracker
from anemo_like.training.cuda_graphs import cuda_graph_refusal
from anemo_like.training.ema import WeightAverage
from anemo_like.training.ensemble import EnsembleMembers
from anemo_like.training.ensemble_loss import EnsembleCRPSLoss
from anemo_like.training.init_model import adopt_model, check_same_grid, read_warm_start
from anemo_like.training.loss import WeightedLoss
from anemo_like.training.memory_fit import check_training_fits
from anemo_like.training.optimizer import build_adamw
from anemo_like.training.placement import Placement, place
from anemo_like.training.scalers import build_loss
from anemo_like.training.schedule import learning_rate_scale
from anemo_like.training.warm_start import freeze_modules, load_matching_weights

LOG = logging.getLogger(__name__)


@dataclass
class Run:
    """A built training run. ``config`` is the resolved one (every ``auto`` of the memory plan replaced)."""

    config: RunConfig
    placement: Placement
    data: DataSetup
    graph: HeteroData
    graph_hash: str
    precision: PrecisionPlan
    model: ForecastModel
    parallel: Parallelized
    optimizer: torch.optim.Optimizer
    lr_factor: float
    loss_fn: WeightedLoss | EnsembleCRPSLoss
    ensemble: EnsembleMembers | None  # training.ensemble: this rank's members (None: deterministic)
    area_weight: torch.Tensor  # (G,)
    spec: ForecastSpec  # positions as tensors on the device
    grid_bounds: list[tuple[int, int]]  # the grid blocks each rank of a reader group reads
    tracker: Tracker | None  # rank 0's experiment tracking (diagnostics.tracking), its sender already started
    memory_plan: MemoryPlan | None  # the plan that resolved auto settings (None: nothing was auto)
    memory_before_model_mib: tuple[float, float]  # memory in use and its peak so far, before the model was built
    weight_average: WeightAverage | None  # training.ema: the averaged weights (None: not kept)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def open_tracking(config: RunConfig, placement: Placement, sender: SenderProcess | None) -> Tracker | None:
    """Rank 0's tracker (``diagnostics.tracking``), its sender running; other ranks stop an early-started sender."""
    tracking = config.diagnostics.tracking
    if tracking.backend == "none" or not placement.is_main:
        if sender is not None:
            sender.cancel()
        return None
    return Tracker(tracking, placement.run_dir, sender=sender)


def load_data_and_graph(
    config: RunConfig, launch: LaunchEnvironment, warm_start: CheckpointWeights | None
) -> tuple[DataSetup, HeteroData]:
    """The dataset and its graph (``training.init_model: checkpoint``: the checkpoint's, with its layout and
    statistics); rank 0 first, so it generates the built-in dataset and caches the graph."""
    statistics, stored = None, None if warm_start is None else warm_start.model
    if warm_start is not None and (config.training.init_statistics == "checkpoint" or stored is not None):
        statistics = (f"training.init_from {warm_start.path}", warm_start.normalizer)
    with main_rank_first(launch):
        data = setup_data(config, statistics=statistics, layout=None if stored is None else stored.layout)
        if stored is not None:  # training.init_model=checkpoint: the checkpoint's own graph
            check_same_grid(data.store, stored, warm_start.path)
            return data, stored.graph
        cache = Path(config.system.paths.cache).expanduser() / "graphs" if config.graph.cache else None
        stretched = config.graph.hidden.kind == "stretched"  # the one mesh that needs the region mask
        graph = load_or_build_graph(
            data.store.latitudes,
            data.store.longitudes,
            cache_dir=cache,
            mesh_resolution=config.graph.mesh_resolution,
            hidden=config.graph.hidden,
            region=point_mask(data.store, REGION) if stretched else None,
            cutoff_factor=config.graph.cutoff_factor,
            knn=config.graph.knn,
            processor_edges=config.model.processor.type == "graphtransformer",
        )
    return data, graph


def resolve_memory_plan(
    config: RunConfig, *, graph: HeteroData, data: DataSetup, placement: Placement
) -> tuple[ModelConfig, MemoryPlan | None, dict[str, tuple[int, int]]]:
    """The model config with every ``num_chunks`` / ``gradient_checkpointing`` ``auto`` replaced by the fastest
    plan that fits the memory budget, that plan (None when nothing is auto) and the mapper chunk counts
    validation needs at its batch size under the same budget (empty when nothing is auto)."""
    if not has_auto_settings(config.model):
        return config.model, None, {}
    budget_gb = config.system.hardware.memory_budget_gb
    budget = int(budget_gb * 2**30) if budget_gb else device_memory_bytes(placement.device)
    # every rank must choose the same plan (their collectives pair up): rank 0's budget decides; the
    # prediction is for a whole, unsharded instance, so with model sharding it errs on the side of more memory
    budget = int(rank_zero_value(str(budget), placement.launch))
    num_parameters = count_parameters(
        config.model, graph, data.layout, config.training.multistep_input, config.training.multistep_output
    )
    batch, members = config.dataloader.batch_size, config.training.ensemble.members
    rows = batch.train * members // config.system.hardware.num_gpus_per_ensemble  # a row per local member
    model_config, plan = resolve_auto_settings(
        config.model,
        graph=graph,
        batch_size=rows,
        num_parameters=num_parameters,
        budget_bytes=budget,
        device=placement.device,
    )
    validation = choose_validation_chunks(  # validation runs every member on each rank
        config=model_config,
        graph=graph,
        batch_size=batch.val * members,
        num_parameters=num_parameters,
        budget_bytes=budget,
        device=placement.device,
    )
    return model_config, plan, validation


def check_run_options(config: RunConfig, placement: Placement) -> PrecisionPlan:
    """Refuse options this machine cannot run (bad ANEMOI_INFERENCE_* variables, CUDA graphs where they cannot
    be captured, unavailable backends); returns the precision plan."""
    check_inference_environment()
    if config.training.cuda_graphs:
        refusal = cuda_graph_refusal(config, placement.device, placement.launch.world_size)
        if refusal is not None:
            raise ValueError(f"training.cuda_graphs=true: {refusal}")
    training = config.training
    precision = precision_plan(
        training.precision, placement.device, cuda_graphs=training.cuda_graphs, compiled=bool(config.model.compile)
    )
    check_backends(config.model, placement.device, precision.autocast_dtype or precision.param_dtype)
    return precision


def build_model(
    config: RunConfig,
    *,
    graph: HeteroData,
    graph_hash: str,
    data: DataSetup,
    placement: Placement,
    dtype: torch.dtype,
    warm_start: CheckpointWeights | None,
):
    """The model on the device: warm-started on the CPU (``training.init_from``; the graph-bound parameters only
    from a checkpoint of this graph, ``graph_hash``), frozen where
    ``training.freeze`` says, with ANEMOI_INFERENCE_* eval overrides (validation) and parallelism applied."""
    if placement.device.type == "cpu":
        set_heap_release(config.system.hardware.release_cpu_heap_mib)
    model = ForecastModel(
        config=config.model,
        graph=graph,
        layout=data.layout,
        multistep=config.training.multistep_input,
        output_steps=config.training.multistep_output,
    )
    if warm_start is not None:
        load_matching_weights(model, warm_start, graph_hash=graph_hash)
    freeze_modules(model, config.training.freeze)
    model = model.to(placement.device, dtype)
    apply_inference_overrides(model)
    parallel = parallelize(model, placement.groups, hardware=config.system.hardware, model_config=config.model)
    return model, parallel


def ensemble_members(config: RunConfig, groups: ProcessGroups, data: DataSetup) -> EnsembleMembers | None:
    """This rank's share of ``training.ensemble.members`` (None for a deterministic run), starting from the
    training samples' dataset members."""
    members, initial = config.training.ensemble.members, data.train.initial_members
    if members == 1:
        return None
    if initial > 1:
        LOG.info("ensemble members start from the initial states of %d dataset members (k: k mod %d)", initial, initial)
    return EnsembleMembers.of(
        members=members,
        group=groups.ensemble_group,
        rank=groups.ensemble_rank,
        size=groups.ensemble_size,
        seed=config.training.seed,
        replica=groups.dp_rank,
        initial_members=data.train.initial_members,
    )


def forecast_spec(config: RunConfig, data: DataSetup) -> ForecastSpec:
    """Where the model's inputs and outputs sit in a sample, and the forced boundary of a limited-area dataset."""
    forced = point_mask(data.store, BOUNDARY)
    return ForecastSpec(
        multistep=config.training.multistep_input,
        input_positions=data.input_positions,
        output_positions=data.output_positions,
        num_prognostic=len(data.roles.prognostic),
        output_steps=config.training.multistep_output,
        forced=None if forced is None else torch.from_numpy(forced),
    )


def build_run(config: RunConfig, *, tracking_sender: SenderProcess | None = None) -> Run:
    """Set up a training run in the fixed order of this module's docstring. ``tracking_sender``: the tracking sender
    the command started early (:meth:`SenderProcess.for_config`), if it did."""
    if config.system.hardware.num_threads:
        torch.set_num_threads(config.system.hardware.num_threads)
    seed_everything(config.training.seed)
    warm_start = read_warm_start(config)
    if warm_start is not None and warm_start.model is not None:
        config = adopt_model(config, warm_start.model, warm_start.path)
    placement = place(config)
    tracker = open_tracking(config, placement, tracking_sender)
    data, graph = load_data_and_graph(config, placement.launch, warm_start)
    graph_hash = graph_fingerprint(graph)
    precision = check_run_options(config, placement)
    model_config, memory_plan, validation_chunks = resolve_memory_plan(
        config, graph=graph, data=data, placement=placement
    )
    config = config.model_copy(update={"model": model_config})
    check_chunks_fit_graph(config.model, graph)
    check_training_fits(config, graph, data, validation_chunks, device=placement.device, launch=placement.launch)
    memory_before_model = (current_memory_mib(placement.device) or 0.0, peak_memory_mib(placement.device) or 0.0)
    model, parallel = build_model(
        config, graph=graph, graph_hash=graph_hash, data=data, placement=placement, dtype=precision.param_dtype,
        warm_start=warm_start,
    )  # fmt: skip
    del warm_start  # its tensors are copied: free the CPU copy before training
    apply_validation_chunks(
        model, validation_chunks, config.dataloader.batch_size.val * config.training.ensemble.members
    )
    opt = config.training.optimizer
    area_weight = torch.as_tensor(graph["data"].area_weight, dtype=torch.float32)
    loss_fn = build_loss(config, data, area_weight)
    return Run(
        config=config,
        placement=placement,
        data=data,
        graph=graph,
        graph_hash=graph_hash,
        precision=precision,
        model=model,
        parallel=parallel,
        optimizer=build_adamw(
            [p for p in model.parameters() if p.requires_grad], opt, capturable=config.training.cuda_graphs
        ),
        lr_factor=learning_rate_scale(opt.lr_scaling, placement.groups.dp_size),
        loss_fn=loss_fn.to(placement.device),
        ensemble=ensemble_members(config, placement.groups, data),
        area_weight=area_weight,
        spec=forecast_spec(config, data).on(placement.device),
        grid_bounds=node_shard_bounds(graph["data"].num_nodes, placement.groups.reader_size),
        tracker=tracker,
        memory_plan=memory_plan,
        memory_before_model_mib=memory_before_model,
        weight_average=WeightAverage(model, decay=ema) if (ema := config.training.ema.decay) is not None else None,
    )


def log_run(run: Run) -> None:
    """The run's size and placement, in the log."""
    config, placement, groups = run.config, run.placement, run.placement.groups
    LOG.info(
        "model: %.2fM parameters, graph: %d data / %d hidden nodes, device %s, run folder %s",
        sum(p.numel() for p in run.model.parameters()) / 1e6,
        run.graph["data"].num_nodes,
        run.graph["hidden"].num_nodes,
        placement.device,
        placement.run_dir,
    )
    if placement.launch.world_size > 1 and placement.is_main:
        lr = config.training.optimizer.lr_scaling
        LOG.info(
            "%d ranks: %d model instance(s) of %d rank(s)%s (encoder %s, processor %s, decoder %s sharding), "
            "samples read by groups of %d rank(s)%s",
            placement.launch.world_size,
            groups.dp_size * groups.ensemble_size,
            groups.model_size,
            f", ensembles of {groups.ensemble_size} instances" if groups.ensemble_size > 1 else "",
            config.model.encoder.shard_strategy,
            config.model.processor.shard_strategy,
            config.model.decoder.shard_strategy,
            groups.reader_size,
            f", lr x {run.lr_factor:.3g} ({lr})" if run.lr_factor != 1 else "",
        )

"""Refuse, before the model is built, a training run whose ensemble members, batches or rollout cannot fit in
memory (``runtime.size_limits``), by the memory model's estimate (``runtime.memory_model``).

A training step of B samples x E members (per model instance) over a rollout of R steps needs the static memory
(weights, gradients, AdamW moments, scratch) plus B x E rows of activations: the step's activation peak, and for
each earlier rollout step what the components keep until backward. A validation batch runs min(batch, samples) x
E rows forward without gradients. The larger of the two is compared with ``system.hardware.memory_budget_gb``, else
the device's memory (``runtime.process_memory.available_memory``); with model sharding each rank of an instance
counts its share.
"""

from __future__ import annotations

import torch
from torch_geometric.data import HeteroData

from anemo_like.config.schema import RunConfig
from anemo_like.data.setup import DataSetup
from anemo_like.distributed.environment import LaunchEnvironment, rank_zero_memory
from anemo_like.runtime.memory_model import activation_peak_bytes, component_models, eval_peak_bytes
from anemo_like.runtime.memory_plan import choose_plan, count_parameters
from anemo_like.runtime.size_limits import Size, check_sizes_fit, run_memory

MEMBERS, ROLLOUT, BATCH, VAL_BATCH = (
    "training.ensemble.members",
    "training.rollout.max",
    "dataloader.batch_size.train",
    "dataloader.batch_size.val",
)
BUDGET_KEY = "system.hardware.memory_budget_gb"


def _row_bytes(
    config: RunConfig, graph: HeteroData, data: DataSetup, device: torch.device, validation_chunks: dict
) -> tuple[int, int, int, int]:
    """Static bytes, and per row: the training step's activation peak, what a rollout step keeps until backward,
    and the validation forward's peak (at the chunk counts validation runs)."""
    training, model = config.training, config.model
    parameters = count_parameters(model, graph, data.layout, training.multistep_input, training.multistep_output)
    plan = choose_plan(
        config=model, graph=graph, batch_size=1, num_parameters=parameters, budget_bytes=0, device=device
    )  # the resolved settings: one plan, its peak for one row
    activation = activation_peak_bytes(plan.components)
    kept = sum(cost.saved_bytes for cost in plan.components.values())
    models = component_models(model, graph, 1)  # one row: every activation term grows with the rows
    counts = [validation_chunks.get(name, (getattr(model, name).num_chunks,))[0] for name in ("encoder", "decoder")]
    return plan.peak_bytes - activation, activation, kept, eval_peak_bytes(models, *counts)


def check_training_fits(
    config: RunConfig,
    graph: HeteroData,
    data: DataSetup,
    validation_chunks: dict[str, tuple[int, int]],
    *,
    device: torch.device,
    launch: LaunchEnvironment,
) -> None:
    """Raise ValueError naming the members, rollout or batch setting when a training step or a validation batch of
    the resolved ``config`` cannot fit the memory; before the model or anything that grows with these is built.
    ``validation_chunks``: the memory plan's mapper chunk counts for validation (empty when it made none)."""
    hardware, training, batch = config.system.hardware, config.training, config.dataloader.batch_size
    static, activation, kept, evaluation = _row_bytes(config, graph, data, device, validation_chunks)
    per_instance, shards, val_samples = hardware.num_gpus_per_ensemble, hardware.num_gpus_per_model, len(data.val)

    def train(v: dict[str, int]) -> int:
        rows = v[BATCH] * v[MEMBERS] // per_instance
        return static + rows * ((v[ROLLOUT] - 1) * kept + activation)

    def validate(v: dict[str, int]) -> int:
        return static + min(v[VAL_BATCH], val_samples) * v[MEMBERS] * evaluation

    sizes = [  # in the order a refusal names them
        Size(MEMBERS, training.ensemble.members, f"{MEMBERS}={training.ensemble.members}", step=per_instance),
        Size(ROLLOUT, training.rollout.max, f"{ROLLOUT}={training.rollout.max}"),
        Size(BATCH, batch.train, f"{BATCH}={batch.train}"),
        Size(VAL_BATCH, batch.val, f"{VAL_BATCH}={batch.val}"),
    ]
    values, members = {size.key: size.value for size in sizes}, training.ensemble.members
    every = f" x {members} members" if members > 1 else ""
    local = f" x {members // per_instance} of the {members} members" if per_instance > 1 else every
    if train(values) >= validate(values):
        what = f"a training step: {batch.train} samples{local}, rollout {training.rollout.max}"
    else:  # validation runs every member on each rank
        what = f"a validation batch: {min(batch.val, val_samples)} samples{every}"
    sharded = f", per rank of the {shards} sharing a model instance" if shards > 1 else ""
    check_sizes_fit(
        sizes,
        lambda v: max(train(v), validate(v)) // shards,
        available=rank_zero_memory(run_memory(hardware.memory_budget_gb, BUDGET_KEY, device), launch),
        what=f"memory model estimate of {what}{sharded}",
        budget_key=BUDGET_KEY,
    )

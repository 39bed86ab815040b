"""Parallelism applied to a built model, in one fixed order: sharding, compile, replication, gradient buckets.

Model sharding only tells each component which rank of its model group runs it; the components hold all the
parameters (they are small next to the activations) and compute their own node blocks. Every rank of a model
group computes the same loss from the gathered output, so with ``D`` instances of ``P`` ranks the gradient of
each parameter summed over the world is ``P`` times the sum of the instances' gradients: averaging over the
whole world (``GradientBuckets.average``) gives the mean over instances, exactly what one process with the global
batch computes. Ensembles spread over ``E`` instances gather their members the same way (every rank of an
ensemble computes its loss), so the world average (over ``D * E * P`` ranks) is the mean over the ``D``
data-parallel replicas' ensemble losses.
"""

from __future__ import annotations

from dataclasses import dataclass

from anemo_like.config.schema import HardwareConfig, ModelConfig
from anemo_like.distributed.data_parallel import GradientBuckets, broadcast_parameters, world_size
from anemo_like.distributed.groups import ProcessGroups
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.sharding import ModelShard
from anemo_like.runtime.compile import compile_modules


@dataclass
class Parallelized:
    """This rank's model shard, and the gradient buckets (None for a single process: gradients are freed)."""

    shard: ModelShard
    gradients: GradientBuckets | None


def shard_model(model: ForecastModel, groups: ProcessGroups) -> ModelShard:
    """Run ``model`` across this rank's model group: every module holding a :class:`ModelShard` gets this rank's
    (nothing changes for a group of one)."""
    shard = ModelShard(groups.model_group, groups.model_rank, groups.model_size)
    smallest = min(model.encoder.num_src, model.encoder.num_dst)
    if smallest < shard.size:
        raise ValueError(
            f"system.hardware.num_gpus_per_model={shard.size} needs at least as many grid and mesh nodes as ranks, "
            f"the graph has {model.encoder.num_src} grid and {model.encoder.num_dst} mesh nodes"
        )
    for module in model.modules():
        if isinstance(getattr(module, "shard", None), ModelShard):
            module.shard = shard
    return shard


def parallelize(
    model: ForecastModel,
    groups: ProcessGroups,
    *,
    hardware: HardwareConfig | None = None,
    model_config: ModelConfig | None = None,
) -> Parallelized:
    """Shard ``model`` over its model group, compile ``model_config.compile``'s modules, start every rank from rank
    0's weights, and on several ranks put the gradients into flat all-reduce buckets. Defaults: no compile, the
    schema's hardware defaults."""
    hardware = hardware or HardwareConfig()
    shard = shard_model(model, groups)
    if model_config is not None and model_config.compile:
        compile_modules(
            model,
            model_config.compile,
            recompile_limit=model_config.recompile_limit,
            on_error=model_config.compile_on_error,
        )
    broadcast_parameters(model, buffers=hardware.broadcast_buffers)
    gradients = None
    if world_size() > 1:
        gradients = GradientBuckets(model.parameters(), bucket_cap_mb=hardware.bucket_cap_mb)
    return Parallelized(shard, gradients)

"""Parallelism applied to a built model, in a fixed order: model sharding first, then data parallelism.

Model sharding only tells each component which rank of its model group runs it; the components hold all the
parameters (they are small next to the activations) and compute their own node blocks. Every rank of a model
group computes the same loss from the gathered output, so with ``D`` instances of ``P`` ranks the gradient of
each parameter summed over the world is ``P`` times the sum of the instances' gradients: averaging over the
whole world (``GradientBuckets.average``) gives the mean over instances, exactly what one process with the global
batch computes.
"""

from __future__ import annotations

from torch import nn

from anemo_like.distributed.data_parallel import broadcast_parameters
from anemo_like.distributed.groups import ProcessGroups
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.sharding import ModelShard


def shard_model(model: ForecastModel, groups: ProcessGroups) -> ModelShard:
    """Run ``model`` across this rank's model group (nothing changes for a group of one)."""
    shard = ModelShard(groups.model_group, groups.model_rank, groups.model_size)
    smallest = min(model.encoder.num_src, model.encoder.num_dst)
    if smallest < shard.size:
        raise ValueError(
            f"system.hardware.num_gpus_per_model={shard.size} needs at least as many grid and mesh nodes as ranks, "
            f"the graph has {model.encoder.num_src} grid and {model.encoder.num_dst} mesh nodes"
        )
    for module in (model, model.encoder, model.processor, model.decoder):
        module.shard = shard
    return shard


def replicate_model(model: nn.Module, *, broadcast_buffers: bool) -> None:
    """Start every rank (every instance and every model rank) from rank 0's weights (and buffers)."""
    broadcast_parameters(model, buffers=broadcast_buffers)


def parallelize(model: ForecastModel, groups: ProcessGroups, *, broadcast_buffers: bool = True) -> ModelShard:
    """Model sharding, then data parallelism; returns this rank's shard."""
    shard = shard_model(model, groups)
    replicate_model(model, broadcast_buffers=broadcast_buffers)
    return shard

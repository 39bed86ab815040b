"""``anemo-infer`` on several ranks (torchrun or srun, the training launch convention).

The world is cut as in training (:mod:`anemo_like.distributed.groups`): model copies of ``num_gpus_per_model``
consecutive ranks. A copy shards its model exactly as training does (every rank of it computes its node blocks and
sees the gathered output; it reads only its block of the grid and gathers the inputs on the device), and the
copies split the initial dates between them, in order. World rank 0 gathers
every copy's forecasts over a CPU (gloo) group, writes the one forecast file and verifies it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed import ProcessGroup

from anemo_like.config.inference import InferenceConfig
from anemo_like.config.schema import RunConfig
from anemo_like.distributed.environment import LaunchEnvironment
from anemo_like.distributed.groups import ProcessGroups, build_process_groups
from anemo_like.distributed.parallelize import shard_model
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.ops.collectives import gather_nodes, node_shard_bounds
from anemo_like.partition import balanced_bounds

LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class InferenceRanks:
    """This rank's place: its model copy and shard, and the group that gathers the forecasts on rank 0."""

    launch: LaunchEnvironment
    groups: ProcessGroups
    gather_group: ProcessGroup | None  # the first rank of every copy (gloo); None with one copy

    @property
    def writes(self) -> bool:
        """World rank 0 gathers, writes and verifies."""
        return self.launch.rank == 0

    @property
    def copies(self) -> int:
        return self.groups.dp_size

    def date_bounds(self, count: int) -> list[tuple[int, int]]:
        """Every copy's ``(start, stop)`` block of ``count`` initial dates (contiguous, in order; empty blocks
        when there are fewer dates than copies)."""
        bounds = balanced_bounds(count, self.copies) if count else []
        return bounds + [(count, count)] * (self.copies - len(bounds))

    def input_block(self, points: int) -> tuple[slice, Callable[[Tensor], Tensor] | None]:
        """This rank's block of the ``points`` grid points to read, and the gather (over its model copy, on the
        device, :func:`gather_grid`) that makes the whole grid of every rank's block; the whole grid and no gather
        for a copy of one rank."""
        groups = self.groups
        if groups.model_size == 1:
            return slice(None), None
        bounds = node_shard_bounds(points, groups.model_size)
        sizes = [stop - start for start, stop in bounds]
        return slice(*bounds[groups.model_rank]), lambda x: gather_grid(x, groups.model_group, sizes)

    def share(self, inputs: ForecastInputs) -> ForecastInputs:
        """The inputs of this rank's copy: its block of the initial dates."""
        start, stop = self.date_bounds(len(inputs.init_indices))[self.groups.dp_rank]
        return dataclasses.replace(inputs, init_indices=inputs.init_indices[start:stop])


def gather_grid(x: Tensor, group: ProcessGroup, sizes: list[int]) -> Tensor:
    """Every rank's grid block of input states, (B, T, g, V) -> (B, T, G, V), gathered one time at a time into the
    whole tensor: the temporaries are those of one time's fields."""
    batch, times, _, variables = x.shape
    whole = x.new_empty((batch, times, sum(sizes), variables))
    for time in range(times):
        whole[:, time] = gather_nodes(x[:, time].contiguous(), group, sizes, dim=1)
    return whole


def ranks_per_copy(config: InferenceConfig, trained: RunConfig, world_size: int) -> int:
    """``num_gpus_per_model``, or the checkpoint's where it divides the world, else 1."""
    if config.num_gpus_per_model is not None:
        if world_size % config.num_gpus_per_model:
            raise ValueError(
                f"num_gpus_per_model={config.num_gpus_per_model} does not divide the world size ({world_size} ranks)"
            )
        return config.num_gpus_per_model
    trained_with = trained.system.hardware.num_gpus_per_model
    return trained_with if world_size % trained_with == 0 else 1


def place_inference(
    config: InferenceConfig, launch: LaunchEnvironment, *, model: ForecastModel, trained: RunConfig
) -> InferenceRanks:
    """Build the groups (every rank calls this) and shard ``model`` over this rank's copy."""
    per_copy = ranks_per_copy(config, trained, launch.world_size)
    heads = trained.model.num_heads
    if per_copy > heads or per_copy & (per_copy - 1):
        raise ValueError(f"num_gpus_per_model={per_copy} must be a power of two and at most the model's {heads} heads")
    groups = build_process_groups(launch.world_size, launch.rank, per_copy)
    shard_model(model, groups)
    firsts = list(range(0, launch.world_size, per_copy))
    gather_group = dist.new_group(firsts, backend="gloo") if len(firsts) > 1 else None
    if launch.distributed:
        LOG.info(
            "rank %d of %d: model copy %d of %d, shard %d of %d",
            launch.rank,
            launch.world_size,
            groups.dp_rank,
            groups.dp_size,
            groups.model_rank,
            groups.model_size,
        )
    return InferenceRanks(launch, groups, gather_group)


def gather_forecasts(forecasts: np.ndarray, ranks: InferenceRanks, count: int) -> np.ndarray | None:
    """Every copy's forecasts (n_copy, ...) as (count, ...) on rank 0, in date order; None elsewhere. (n, M, L, G,
    V) from :func:`~anemo_like.inference.forecast.run_forecasts`."""
    if ranks.copies == 1:
        return forecasts if ranks.writes else None
    if ranks.groups.model_rank != 0:  # the copy's first rank sends for it
        return None
    bounds = ranks.date_bounds(count)
    most = max(stop - start for start, stop in bounds)
    padded = torch.zeros((most, *forecasts.shape[1:]), dtype=torch.float32)
    padded[: len(forecasts)] = torch.from_numpy(forecasts)
    received = [torch.empty_like(padded) for _ in bounds] if ranks.writes else None
    dist.gather(padded, received, dst=0, group=ranks.gather_group)
    if received is None:
        return None
    blocks = zip(received, bounds, strict=True)
    return np.concatenate([block[: stop - start].numpy() for block, (start, stop) in blocks])

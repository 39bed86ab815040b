"""Process groups of a model-sharded run: D model instances of P ranks each.

World rank ``r`` is position ``r % P`` of model instance ``r // P``. A model group is the P consecutive ranks of one
instance; a data-parallel group holds the ranks at the same position of every instance; a reader group is a
consecutive sub-block of a model group (the ranks that read one sample together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed import ProcessGroup

Ranks = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class GroupLayout:
    """The rank lists of every group, in the order every rank creates them."""

    model: Ranks
    data_parallel: Ranks
    reader: Ranks


@dataclass(frozen=True)
class ProcessGroups:
    """This rank's groups; a group of one rank is ``None`` (no collectives needed)."""

    model_group: ProcessGroup | None
    model_rank: int
    model_size: int
    dp_group: ProcessGroup | None
    dp_rank: int
    dp_size: int
    reader_group: ProcessGroup | None
    reader_rank: int
    reader_size: int


def group_layout(world_size: int, ranks_per_model: int, read_group_size: int | None = None) -> GroupLayout:
    """Model, data-parallel and reader rank lists for ``world_size`` ranks and ``ranks_per_model`` ranks per model."""
    per_model = ranks_per_model  # a power of two, divisible by read_group_size: the config schema checked it
    if world_size < 1 or per_model < 1 or world_size % per_model:
        raise ValueError(
            f"system.hardware.num_gpus_per_model={per_model} does not divide the world size ({world_size} ranks)"
        )
    read = per_model if read_group_size is None else read_group_size
    models = world_size // per_model
    return GroupLayout(
        model=tuple(tuple(range(m * per_model, (m + 1) * per_model)) for m in range(models)),
        data_parallel=tuple(tuple(range(p, world_size, per_model)) for p in range(per_model)),
        reader=tuple(tuple(range(start, start + read)) for start in range(0, world_size, read)),
    )


def _create_groups(groups: Ranks, rank: int) -> tuple[ProcessGroup | None, int, int]:
    """Create every group of ``groups`` (collectively, on every rank); return this rank's group, rank and size."""
    mine: tuple[ProcessGroup | None, int, int] | None = None
    for ranks in groups:
        group = dist.new_group(list(ranks)) if len(ranks) > 1 else None
        if rank in ranks:
            mine = (group, ranks.index(rank), len(ranks))
    if mine is None:
        raise ValueError(f"rank {rank} is in none of the groups {groups}")
    return mine


def build_process_groups(
    world_size: int, rank: int, ranks_per_model: int, read_group_size: int | None = None
) -> ProcessGroups:
    """Create the model, data-parallel and reader groups (every rank must call this with the same arguments)."""
    layout = group_layout(world_size, ranks_per_model, read_group_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size} ranks")
    if world_size > 1 and (not dist.is_initialized() or dist.get_world_size() != world_size or dist.get_rank() != rank):
        raise ValueError(f"rank {rank} of {world_size} needs an initialised process group of that world size and rank")
    model = _create_groups(layout.model, rank)
    data_parallel = _create_groups(layout.data_parallel, rank)
    reader = _create_groups(layout.reader, rank)
    return ProcessGroups(*model, *data_parallel, *reader)

"""Process groups of a model-sharded run: D model instances of P ranks each, in ensembles of E instances.

World rank ``r`` is position ``r % P`` of model instance ``i = r // P``, which runs its share of the members of
ensemble ``d = i // E`` (E = 1 without ensembles). A model group is the P consecutive ranks of one instance; an
ensemble group holds the ranks at the same position of the E instances of one ensemble (they read the same
samples); a data-parallel group holds the ranks at the same position and ensemble place of every ensemble (its
rank ``d`` says which samples to read); a reader group is a consecutive sub-block of a model group (the ranks that
read one sample together).
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
    ensemble: Ranks


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
    ensemble_group: ProcessGroup | None = None
    ensemble_rank: int = 0
    ensemble_size: int = 1


def group_layout(
    world_size: int, ranks_per_model: int, read_group_size: int | None = None, models_per_ensemble: int = 1
) -> GroupLayout:
    """Model, data-parallel, reader and ensemble rank lists for ``world_size`` ranks, ``ranks_per_model`` ranks per
    model instance and ``models_per_ensemble`` instances per ensemble."""
    per_model = ranks_per_model  # a power of two, divisible by read_group_size: the config schema checked it
    if world_size < 1 or per_model < 1 or world_size % per_model:
        raise ValueError(
            f"system.hardware.num_gpus_per_model={per_model} does not divide the world size ({world_size} ranks)"
        )
    per_ensemble = per_model * models_per_ensemble
    if models_per_ensemble < 1 or world_size % per_ensemble:
        raise ValueError(
            f"system.hardware.num_gpus_per_ensemble={models_per_ensemble} model instances of {per_model} rank(s) "
            f"do not divide the world size ({world_size} ranks)"
        )
    read = per_model if read_group_size is None else read_group_size
    models = world_size // per_model
    places = range(per_ensemble)  # (ensemble place, model position) of a rank: r % (E * P)
    return GroupLayout(
        model=tuple(tuple(range(m * per_model, (m + 1) * per_model)) for m in range(models)),
        data_parallel=tuple(tuple(range(q, world_size, per_ensemble)) for q in places),
        reader=tuple(tuple(range(start, start + read)) for start in range(0, world_size, read)),
        ensemble=tuple(
            tuple(range(start + p, start + per_ensemble, per_model))
            for start in range(0, world_size, per_ensemble)
            for p in range(per_model)
        ),
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
    world_size: int,
    rank: int,
    ranks_per_model: int,
    read_group_size: int | None = None,
    models_per_ensemble: int = 1,
) -> ProcessGroups:
    """Create the model, data-parallel, reader and ensemble groups (every rank must call this with the same
    arguments)."""
    layout = group_layout(world_size, ranks_per_model, read_group_size, models_per_ensemble)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside the world of {world_size} ranks")
    if world_size > 1 and (not dist.is_initialized() or dist.get_world_size() != world_size or dist.get_rank() != rank):
        raise ValueError(f"rank {rank} of {world_size} needs an initialised process group of that world size and rank")
    model = _create_groups(layout.model, rank)
    data_parallel = _create_groups(layout.data_parallel, rank)
    reader = _create_groups(layout.reader, rank)
    ensemble = _create_groups(layout.ensemble, rank)
    return ProcessGroups(*model, *data_parallel, *reader, *ensemble)

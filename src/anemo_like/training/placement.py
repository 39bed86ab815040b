"""Where a training process runs: its launch environment, device, process groups and run folder
(:func:`place`, the second step of :func:`~anemo_like.training.setup.build_run`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from anemo_like.config.schema import RunConfig
from anemo_like.distributed.environment import LaunchEnvironment, launch_environment, rank_zero_value, select_device
from anemo_like.distributed.groups import ProcessGroups, build_process_groups
from anemo_like.training.run_folder import check_run_folder_is_free, create_run_folder, remove_stale_temporary_files


@dataclass
class Placement:
    """Where this process runs: its launch environment, device, process groups and run folder."""

    launch: LaunchEnvironment
    device: torch.device
    groups: ProcessGroups
    run_dir: Path

    @property
    def is_main(self) -> bool:
        return self.launch.rank == 0

    @property
    def validates(self) -> bool:
        """The ranks of model instance 0 validate (with ensembles: all the members, on that instance); rank 0
        writes."""
        return self.groups.dp_rank == 0 and self.groups.ensemble_rank == 0


def place(config: RunConfig) -> Placement:
    """Launch environment, device, process groups and the run folder (rank 0's name on every rank), which must not
    hold another run."""
    launch = launch_environment()
    if launch.distributed and not dist.is_initialized():
        raise RuntimeError(
            f"launched as rank {launch.rank} of {launch.world_size}, but no process group is open: the command "
            "(anemo-train, anemo-bench, anemo-profile) opens it"
        )
    hardware = config.system.hardware
    device = select_device(hardware.accelerator, launch.local_rank)
    run_dir = Path(rank_zero_value(str(Path(config.system.paths.output).expanduser()), launch))
    create_run_folder(run_dir)
    check_run_folder_is_free(run_dir, resume=config.training.resume)  # before rank 0 writes anything
    if launch.rank == 0:
        remove_stale_temporary_files(run_dir)
    groups = build_process_groups(
        launch.world_size,
        launch.rank,
        hardware.num_gpus_per_model,
        config.dataloader.read_group_size,
        hardware.num_gpus_per_ensemble,
    )
    return Placement(launch, device, groups, run_dir)

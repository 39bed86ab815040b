"""Which process this is, from the launcher's environment, and the process group of a multi-process run.

One convention: torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``), else SLURM
``srun`` (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``; the master is the first host of
``SLURM_JOB_NODELIST``), else a plain single process.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from anemo_like.runtime.process_memory import AvailableMemory

DEFAULT_PORT = 29500


def _int_variable(name: str, what: str) -> int | None:
    value = os.environ.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer {what}") from None


def launch_rank() -> int:
    """Global rank: ``RANK`` (torchrun), else ``SLURM_PROCID`` (srun), else 0 (a single process)."""
    for variable in ("RANK", "SLURM_PROCID"):
        value = _int_variable(variable, "rank")
        if value is not None:
            return value
    return 0


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list: 'gpu[003-005,007],cpu1' -> 'gpu003'."""
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if match is None:
        raise ValueError(f"SLURM_JOB_NODELIST={nodelist!r} is not a SLURM node list")
    prefix, ranges = match.groups()
    return prefix if ranges is None else prefix + ranges.split(",")[0].split("-")[0]


@dataclass(frozen=True)
class LaunchEnvironment:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def launch_environment() -> LaunchEnvironment:
    """The launch environment of this process (see the module docstring)."""
    if "WORLD_SIZE" in os.environ or "RANK" in os.environ:
        return LaunchEnvironment(
            rank=launch_rank(),
            local_rank=_int_variable("LOCAL_RANK", "rank") or 0,
            world_size=_int_variable("WORLD_SIZE", "world size") or 1,
            master_addr=os.environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=_int_variable("MASTER_PORT", "port") or DEFAULT_PORT,
        )
    if "SLURM_PROCID" in os.environ and (_int_variable("SLURM_NTASKS", "task count") or 1) > 1:
        job = _int_variable("SLURM_JOB_ID", "job id") or 0
        return LaunchEnvironment(
            rank=launch_rank(),
            local_rank=_int_variable("SLURM_LOCALID", "rank") or 0,
            world_size=_int_variable("SLURM_NTASKS", "task count") or 1,
            master_addr=os.environ.get("MASTER_ADDR") or first_slurm_host(os.environ.get("SLURM_JOB_NODELIST", "")),
            master_port=_int_variable("MASTER_PORT", "port") or DEFAULT_PORT + job % 1000,
        )
    return LaunchEnvironment(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1", master_port=DEFAULT_PORT)


def init_process_group(env: LaunchEnvironment, device: torch.device, *, timeout_minutes: float) -> None:
    """Join the world (NCCL on CUDA, gloo on CPU). Every collective fails after ``timeout_minutes`` instead of
    hanging, and a rank that dies makes the others' next collective fail."""
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(minutes=timeout_minutes),
    )


class PeerFailed(RuntimeError):
    """A collective failed: another rank stopped (its own message says why) or did not answer in time."""


def is_collective_failure(error: RuntimeError) -> bool:
    """Whether ``error`` is a collective that failed for want of a peer (gloo raises a plain RuntimeError)."""
    text = str(error)
    peers = ("Connection closed by peer", "Connection reset by peer", "Timed out waiting")
    return isinstance(error, dist.DistError) or any(marker in text for marker in peers)


@contextlib.contextmanager
def process_group(accelerator: str, *, timeout_minutes: float) -> Iterator[LaunchEnvironment]:
    """The world for the block when launched with several ranks (torchrun or srun); left on every exit path. A
    normal exit (preemption included) waits for every rank first; an error leaves at once, so no rank waits on one
    that failed, and a collective that fails because another rank did becomes :class:`PeerFailed` (one line: the
    failing rank prints the reason). A single process opens nothing."""
    env = launch_environment()
    if not env.distributed:
        yield env
        return
    init_process_group(env, select_device(accelerator, env.local_rank), timeout_minutes=timeout_minutes)
    try:
        yield env
    except RuntimeError as error:
        if not is_collective_failure(error):
            raise
        raise PeerFailed(
            f"rank {env.rank} of {env.world_size} stopped: a collective failed because another rank stopped (its "
            f"message says why) or did not answer within {timeout_minutes:g} minutes"
        ) from None
    except SystemExit as stop:
        if stop.code in (0, None):
            dist.barrier()
        raise
    else:
        dist.barrier()
    finally:
        dist.destroy_process_group()


@contextlib.contextmanager
def main_rank_first(env: LaunchEnvironment) -> Iterator[None]:
    """Rank 0 runs the block first (e.g. writing a cache); the other ranks run it once rank 0 is done."""
    if env.distributed and env.rank != 0:
        dist.barrier()
    yield
    if env.distributed and env.rank == 0:
        dist.barrier()


def rank_zero_value(value: str, env: LaunchEnvironment) -> str:
    """Rank 0's ``value`` on every rank (e.g. the run folder, whose default name has a start time in it)."""
    if not env.distributed:
        return value
    shared = [value]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def rank_zero_memory(memory: AvailableMemory, launch: LaunchEnvironment) -> AvailableMemory:
    """Rank 0's memory figure on every rank, so that the ranks of a run refuse a size together."""
    size, source = rank_zero_value(f"{memory.bytes} {memory.source}", launch).split(" ", 1)
    return AvailableMemory(int(size), source)


def select_device(accelerator: str, local_rank: int = 0, *, key: str = "system.hardware.accelerator") -> torch.device:
    """``cpu``, ``cuda`` (the GPU of this local rank) or ``auto`` (CUDA when torch sees one); ``key`` names the setting
    in the error when CUDA is asked for but absent."""
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{key} is 'cuda' but torch sees no CUDA device; use 'cpu' or 'auto'")
    use_cuda = accelerator == "cuda" or (accelerator == "auto" and torch.cuda.is_available())
    return torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")

"""Process memory readings from /proc/self/status (Linux); ``None`` where unavailable. The memory a process can
still allocate on a device (:func:`available_memory`)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

from anemo_like.runtime.cgroup_memory import cgroup_memory


def _status_kib(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_mib() -> float | None:
    """High-water mark of this process's resident memory (VmHWM), MiB. Unlike ru_maxrss, not inherited."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib / 1024


def current_rss_mib() -> float | None:
    """Current resident memory (VmRSS), MiB."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib / 1024


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int | None:
    """Current resident memory from /proc/self/statm (one short line: cheap enough to read every millisecond)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except OSError:
        return None


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); returns whether it worked."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def peak_memory_mib(device: torch.device) -> float | None:
    """Peak memory so far, MiB: CUDA's max allocated on a GPU, else the process's VmHWM (None where unknown)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return peak_rss_mib()


def current_memory_mib(device: torch.device) -> float | None:
    """Memory in use now, MiB: CUDA's allocated bytes on a GPU, else the process's resident memory."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / 2**20
    return current_rss_mib()


@dataclass(frozen=True)
class AvailableMemory:
    """Bytes a run may still use, and where the figure comes from (a config key, MemAvailable, ...)."""

    bytes: int
    source: str


def _meminfo_bytes(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields[field].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _address_space_room() -> AvailableMemory | None:
    """The room left under the process's address-space limit (RLIMIT_AS less what it maps now; None: no limit)."""
    limit, mapped = resource.getrlimit(resource.RLIMIT_AS)[0], _status_kib("VmSize")
    if limit == resource.RLIM_INFINITY or mapped is None:
        return None
    room = max(0, limit - mapped * 1024)
    return AvailableMemory(room, f"RLIMIT_AS {limit / 2**30:.1f} GiB less the {mapped / 2**20:.1f} GiB mapped")


def available_memory(device: torch.device) -> AvailableMemory:
    """What this process can allocate on ``device``: a GPU's total memory; on CPU the least of the system's
    MemAvailable (/proc/meminfo; else the physical memory), the room under the process's address-space limit
    (RLIMIT_AS less what it maps now) and the room under its control group's memory limit (a SLURM job's --mem)."""
    if device.type == "cuda":
        return AvailableMemory(torch.cuda.get_device_properties(device).total_memory, "the GPU's total memory")
    free = _meminfo_bytes("MemAvailable")
    candidates = [
        AvailableMemory(free, "MemAvailable")
        if free is not None
        else AvailableMemory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory")
    ]
    room = _address_space_room()
    if room is not None:
        candidates.append(room)
    group = cgroup_memory()
    if group is not None:
        limit, in_use = group.limit / 2**30, group.in_use / 2**30
        source = f"the cgroup limit {limit:.1f} GiB ({group.where}) less the {in_use:.1f} GiB in use"
        candidates.append(AvailableMemory(group.room, source))
    return min(candidates, key=lambda memory: memory.bytes)


@dataclass(frozen=True)
class MemoryCeiling:
    """The most a process could ever use under one limit: the memory, how a refusal names it (``phrase``, with
    ``{limit}`` for the formatted size and ``{source}`` for ``memory.source``) and what raises it."""

    memory: AvailableMemory
    phrase: str
    remedy: str = ""


def cpu_memory_ceilings() -> list[MemoryCeiling]:
    """The most a CPU run could ever use: the room under RLIMIT_AS, the control group's memory limit and the
    machine's memory (MemTotal); a budget above any of them cannot be kept."""
    ceilings = []
    room = _address_space_room()
    if room is not None:
        ceilings.append(
            MemoryCeiling(room, "this process may still use ({limit}: {source})", "raise the limit (ulimit -v)")
        )
    group = cgroup_memory()
    if group is not None:
        where = f"the memory limit of this process's control group, {group.where}"
        remedy = "ask for more memory (SLURM --mem, a container's limit)"
        ceilings.append(MemoryCeiling(AvailableMemory(group.limit, where), "{source} ({limit})", remedy))
    total = _meminfo_bytes("MemTotal")
    if total is not None:
        ceilings.append(MemoryCeiling(AvailableMemory(total, "this machine's memory, MemTotal"), "{source} ({limit})"))
    return ceilings

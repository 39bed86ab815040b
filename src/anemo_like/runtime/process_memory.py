"""Process memory readings from /proc/self/status (Linux); ``None`` where unavailable. The memory a process can
still allocate on a device (:func:`available_memory`)."""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

import torch


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


def available_memory(device: torch.device) -> AvailableMemory:
    """What this process can allocate on ``device``: a GPU's total memory; on CPU the system's MemAvailable
    (/proc/meminfo; else the physical memory), or the room left under the process's address-space limit
    (RLIMIT_AS less what it maps now) where that is less."""
    if device.type == "cuda":
        return AvailableMemory(torch.cuda.get_device_properties(device).total_memory, "the GPU's total memory")
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        memory = AvailableMemory(int(fields["MemAvailable"].split()[0]) * 1024, "MemAvailable")
    except (OSError, KeyError, ValueError):
        memory = AvailableMemory(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory")
    limit, mapped = resource.getrlimit(resource.RLIMIT_AS)[0], _status_kib("VmSize")
    if limit != resource.RLIM_INFINITY and mapped is not None and limit - mapped * 1024 < memory.bytes:
        return AvailableMemory(
            max(0, limit - mapped * 1024), f"RLIMIT_AS {limit / 2**30:.1f} GiB less the {mapped / 2**20:.1f} GiB mapped"
        )
    return memory

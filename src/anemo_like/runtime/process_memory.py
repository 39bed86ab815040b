"""Process memory readings from /proc/self/status (Linux); ``None`` where unavailable."""

from __future__ import annotations

import os
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

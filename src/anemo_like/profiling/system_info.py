"""What the machine and software are: the context every performance figure needs."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch

ENV_PREFIXES = ("PYTORCH_", "CUDA_", "NCCL_", "OMP_", "MKL_", "MALLOC_", "ANEMOI_", "TORCH_", "TRITON_", "SLURM_JOB")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _memory_total_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        return None
    return None


def system_info() -> dict:
    """Host, devices, versions and the environment variables that change performance."""
    devices = (
        [
            {
                "name": torch.cuda.get_device_name(i),
                "memory_gib": torch.cuda.get_device_properties(i).total_memory / 2**30,
            }
            for i in range(torch.cuda.device_count())
        ]
        if torch.cuda.is_available()
        else []
    )
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total_gib": _memory_total_gib(),
        "torch_threads": torch.get_num_threads(),
        "cuda_devices": devices,
        "versions": {
            "anemo_like": _version("anemo_like"),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda,
            "triton": _version("triton"),
            "flash_attn": _version("flash_attn") or _version("flash-attn"),
            "torch_geometric": _version("torch_geometric") or _version("torch-geometric"),
        },
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }

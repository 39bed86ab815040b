"""Which process this is, from the launcher's environment: torchrun, SLURM ``srun``, or a plain single process."""

from __future__ import annotations

import os


def launch_rank() -> int:
    """Global rank: ``RANK`` (torchrun), else ``SLURM_PROCID`` (srun), else 0 (a single process)."""
    for variable in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(variable)
        if value is not None:
            try:
                return int(value)
            except ValueError:
                raise ValueError(f"environment variable {variable}={value!r} is not an integer rank") from None
    return 0

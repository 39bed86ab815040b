"""Seeded processor noise of ensemble members: each member of each forward pass draws from its own generator,
seeded by (seed, stream, step, member, replica), so a member's forecast does not depend on the batch or the rank that
runs it. Shared by training, validation and ``anemo-infer`` (one stream each)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

TRAIN_STREAM, VALIDATION_STREAM, INFERENCE_STREAM = 0, 1, 2
"""The ``stream`` of :func:`member_seed` for training, validation and inference."""


def member_seed(seed: int, stream: int, step: int, member: int, replica: int = 0) -> int:
    """A 63-bit generator seed for one member of one step of a stream (training, validation, inference) on one
    data-parallel ``replica``."""
    entropy = [seed, stream, step, member, replica]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)


def member_noise(
    shape: tuple[int, int, int] | None, *, seeds: list[int], device: torch.device
) -> Callable[[int], Tensor] | None:
    """Processor noise for consecutive forward passes of B * len(seeds) member-minor rows: pass i reads the i-th
    (B, N, D) draw of each member's generator (on the CPU, so a seed gives the same noise on any device), as
    (B * m, N, D). ``shape``: the model's :meth:`noise_shape` for B rows (None: a deterministic model)."""
    if shape is None:
        return None
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def noise(_: int) -> Tensor:
        draws = [torch.randn(shape, generator=g) for g in generators]  # m of (B, N, D)
        return torch.stack(draws, dim=1).flatten(0, 1).to(device, non_blocking=True)

    return noise

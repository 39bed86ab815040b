"""Weights with NaN or inf are never written to, nor loaded from, a checkpoint."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from torch import Tensor


def first_nonfinite(
    tensors: Mapping[str, Tensor], after_each: Callable[[Tensor], None] | None = None
) -> tuple[str, int] | None:
    """The first floating-point tensor holding NaN or inf, with how many such values; None when all are finite.
    ``after_each`` is called with each tensor once it is checked."""
    for name, tensor in tensors.items():
        if tensor.is_floating_point():
            bad = int(tensor.numel() - tensor.isfinite().sum())
            if after_each is not None:
                after_each(tensor)
            if bad:
                return name, bad
    return None


def check_finite_weights(
    weights: Mapping[str, Tensor], path: Path, *, what: str, after_each: Callable[[Tensor], None] | None = None
) -> None:
    """Refuse to load ``weights`` (a state dict read from ``path``) holding NaN or inf; ``after_each``: called with
    each tensor once it is checked (to give back the pages of weights mapped from the file)."""
    found = first_nonfinite(weights, after_each)
    if found is not None:
        name, bad = found
        raise ValueError(
            f"{path} is not a usable {what}: its weights hold NaN or inf ({name}: {bad} values); it was written by a "
            "run that diverged: use an earlier checkpoint"
        )

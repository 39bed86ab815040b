"""Activation checkpointing helpers shared by mappers and processors."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from anemo_like.models.heap_release import maybe_release_heap
from anemo_like.partition import balanced_bounds


def maybe_checkpoint(enabled: bool, fn: Callable[..., Tensor], *args: object) -> Tensor:
    """Run ``fn(*args)``; when ``enabled`` and gradients are on, keep only its inputs and recompute in backward.

    Every run (and recomputation) of ``fn`` is a chunk boundary: free CPU heap may be released first.
    """

    def run(*inputs: object) -> Tensor:
        maybe_release_heap()
        return fn(*inputs)

    if enabled and torch.is_grad_enabled():
        return checkpoint(run, *args, use_reentrant=False)
    return run(*args)


def run_layer_segments(
    layers: Sequence[nn.Module], x: Tensor, *, num_segments: int, checkpointing: bool, **kwargs: object
) -> Tensor:
    """Apply ``layers`` in order, grouped into ``num_segments`` checkpoint segments of consecutive layers."""

    def run(start: int, stop: int) -> Callable[[Tensor], Tensor]:
        def segment(h: Tensor) -> Tensor:
            for layer in layers[start:stop]:
                h = layer(h, **kwargs)
            return h

        return segment

    for start, stop in balanced_bounds(len(layers), num_segments):
        x = maybe_checkpoint(checkpointing, run(start, stop), x)
    return x

"""Activation checkpointing helpers shared by mappers and processors."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from anemo_like.partition import balanced_bounds

_chunk_boundary: Callable[[], None] | None = None


def on_chunk_boundary(callback: Callable[[], None] | None) -> None:
    """Call ``callback`` before every chunk and checkpoint segment from now on (None: nothing). The runtime sets
    the CPU heap release here (:func:`anemo_like.runtime.heap_release.set_heap_release`)."""
    global _chunk_boundary
    _chunk_boundary = callback


def maybe_checkpoint(enabled: bool, fn: Callable[..., Tensor], *args: object) -> Tensor:
    """Run ``fn(*args)``; when ``enabled`` and gradients are on, keep only its inputs and recompute in backward.

    Every run (and recomputation) of ``fn`` is a chunk boundary: the :func:`on_chunk_boundary` callback runs first.
    """

    def run(*inputs: object) -> Tensor:
        if _chunk_boundary is not None:
            _chunk_boundary()
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

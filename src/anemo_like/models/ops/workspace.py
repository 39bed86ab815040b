"""Scratch buffers reused by the blocked kernels (graph attention, node MLP).

The blocked kernels make many transient tensors of one bounded size. Taking them from a few buffers that live
for the whole run, instead of allocating each one, keeps the allocator's heap from fragmenting: on CPU, glibc
otherwise spreads differently sized transients over an ever larger heap and the process's resident memory
grows far past the live tensors. Buffers are per thread, device, dtype and inference mode, and only grow.

How many elements one block holds (``model.block_elements``) trades memory for host work: every block costs a dozen
or more operator dispatches, which a GPU pays as kernel launches. ``resolve_block_elements`` gives the default per
device.
"""

from __future__ import annotations

import math
import threading

import torch
from torch import Tensor

_local = threading.local()

CPU_BLOCK_ELEMENTS = 1 << 18
"""Default elements of one block on CPU (1 MiB in fp32): cache-sized. At the reference model blocks of 2^22 made the
CPU step 5-20 % slower."""
GPU_BLOCK_ELEMENTS = 1 << 24
"""Default elements of one block on a GPU (64 MiB in fp32): few, large blocks. At the reference model they cut the
operators a training step dispatches from 54,900 to 7,700 (``torch`` attention backend) and from 12,500 to 5,100
(``triton``), against 5,824 for anemoi-models (``benchmarks/speed/host_overhead.py``)."""


def resolve_block_elements(requested: int | None, device: torch.device) -> int:
    """``requested`` (``model.block_elements``), or when None the default for ``device``'s type."""
    if requested is not None:
        return requested
    return CPU_BLOCK_ELEMENTS if torch.device(device).type == "cpu" else GPU_BLOCK_ELEMENTS


def scratch(
    name: str, shape: tuple[int, ...], like: Tensor, reserve: int = 0, dtype: torch.dtype | None = None
) -> Tensor:
    """A contiguous (uninitialised) tensor of ``shape`` on ``like``'s device, in ``dtype`` (default: like's),
    backed by the buffer ``name`` of that dtype, which holds at least ``reserve`` elements (so later, larger
    requests need no new buffer). The result is only valid until the next call with the same name and dtype:
    never return or save it."""
    buffers: dict[tuple[str, torch.device, torch.dtype, bool], Tensor] = _local.__dict__.setdefault("buffers", {})
    dtype = dtype or like.dtype
    # a buffer made under torch.inference_mode (anemo-infer) cannot be written outside it (training, later in the
    # same process): one set of buffers for each
    key, numel = (name, like.device, dtype, torch.is_inference_mode_enabled()), math.prod(shape)
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < numel:
        buffers.pop(key, None)
        buffer = torch.empty(max(numel, reserve), device=like.device, dtype=dtype)
        buffers[key] = buffer
    return buffer[:numel].view(shape)


def held_bytes() -> int:
    """Bytes the calling thread's scratch buffers hold (memory accounting: they live for the whole run)."""
    buffers: dict = _local.__dict__.get("buffers", {})
    return sum(buffer.untyped_storage().nbytes() for buffer in buffers.values())

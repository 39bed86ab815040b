"""Weights read from the checkpoint file as each part of the model runs, and dropped from resident memory after it.

An inference checkpoint's tensors are mapped from its file (``load_inference_checkpoint``), so the kernel reads a
weight's pages when it is first used and keeps them resident. When the forecast's memory plan cannot hold every
weight beside the activations, each part (encoder, each processor layer, decoder) gives its pages back after it ran
(``madvise(MADV_DONTNEED)``): the next use reads them again from the page cache, a minor fault per page (about 0.3 s
per GB on CPU), and the process holds one part's weights at a time. Linux only; elsewhere nothing is paged.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import sys
from collections.abc import Iterable
from pathlib import Path

from torch import Tensor, nn

MADV_DONTNEED = 4  # linux/mman.h
PAGE = mmap.PAGESIZE


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges where ``path`` is mapped into this process (none off Linux)."""
    maps = Path("/proc/self/maps")
    if not sys.platform.startswith("linux") or not maps.exists():
        return []
    target, ranges = str(path.resolve()), []
    for line in maps.read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and fields[5] == target:
            start, stop = (int(value, 16) for value in fields[0].split("-"))
            ranges.append((start, stop))
    return ranges


def _pages(tensors: Iterable[Tensor], ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(address, length) of the whole pages each tensor's data covers inside one of ``ranges``."""
    spans = []
    for tensor in tensors:
        start = tensor.data_ptr()
        stop = start + tensor.numel() * tensor.element_size()  # parameters are contiguous
        first, last = -(-start // PAGE) * PAGE, stop // PAGE * PAGE
        if last > first and any(low <= start and stop <= high for low, high in ranges):
            spans.append((first, last - first))
    return spans


def give_back(tensors: Iterable[Tensor], ranges: list[tuple[int, int]]) -> None:
    """Drop the resident pages of ``tensors`` that are mapped in ``ranges`` (read again where next used)."""
    spans = _pages(tensors, ranges)
    if spans:
        _madvise(spans)


def _madvise(spans: list[tuple[int, int]]) -> None:
    libc = _libc()
    for address, length in spans:
        libc.madvise(address, length, MADV_DONTNEED)


@functools.cache
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return libc


def page_weights(model: nn.Module, checkpoint: Path, parts: Iterable[nn.Module]) -> int:
    """Give back the pages of each of ``parts``' weights mapped from ``checkpoint`` after each forward of the part,
    and of every other mapped weight of ``model`` after each forward of the model; returns the bytes paged (0: none
    mapped, or not on Linux)."""
    ranges = mapped_ranges(checkpoint)
    for part in [*parts, model]:  # the model last: node and edge features, and whatever else is mapped
        spans = _pages(part.parameters(), ranges)
        if spans:
            part.register_forward_hook(lambda *_, spans=spans: _madvise(spans))
    return sum(length for _, length in _pages(model.parameters(), ranges))

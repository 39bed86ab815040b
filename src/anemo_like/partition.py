"""Contiguous balanced partitions of an index range: mapper chunks, checkpoint segments, node shards."""

from __future__ import annotations


def balanced_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """Split ``range(total)`` into ``parts`` contiguous ranges whose sizes differ by at most one."""
    parts = max(1, min(parts, total)) if total else 1
    base, extra = divmod(total, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (i < extra)
        bounds.append((start, stop))
        start = stop
    return bounds

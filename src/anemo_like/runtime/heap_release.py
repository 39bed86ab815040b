"""Give freed CPU heap memory back to the operating system between chunks (glibc only).

On CPU, activations live in the C heap. glibc keeps freed blocks resident and places small long-lived
objects inside large free regions, so when chunked work frees and re-allocates many same-sized tensors the
heap spreads out: at the reference size the process's peak resident memory was 2.5x its peak of live
tensors. ``maybe_release_heap`` runs at every mapper chunk and processor segment (registered with the network's chunk
boundary callback); when the process has
grown by more than the configured amount since the last release and that much heap is free, it calls
``malloc_trim``, which returns whole free pages to the system. The cost is the page faults when released memory
is used again.

Set by ``system.hardware.release_cpu_heap_mib`` (``None`` switches it off). No effect off glibc, and it does
nothing for GPU memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from anemo_like.models.ops.checkpointing import on_chunk_boundary
from anemo_like.runtime.process_memory import resident_bytes


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2``: ten size_t fields; ``fordblks`` is the free heap in bytes."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ]
    _fields_.append(("keepcost", ctypes.c_size_t))


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc >= 2.33 (has ``mallinfo2`` and ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


_threshold_bytes: int | None = None
_rss_after_release = 0


def set_heap_release(threshold_mib: float | None) -> bool:
    """Release free heap above ``threshold_mib`` at chunk boundaries from now on (None: never).

    Returns whether releasing is active (False off glibc or when switched off)."""
    global _threshold_bytes, _rss_after_release
    _threshold_bytes = None if threshold_mib is None or _glibc() is None else int(threshold_mib * 2**20)
    _rss_after_release = 0
    on_chunk_boundary(None if _threshold_bytes is None else maybe_release_heap)
    return _threshold_bytes is not None


def free_heap_bytes() -> int | None:
    """Bytes of free memory held in the main heap, or None off glibc."""
    libc = _glibc()
    return None if libc is None else int(libc.mallinfo2().fordblks)


def maybe_release_heap() -> None:
    """Return free heap pages to the system when the process has grown by more than the threshold since the
    last release (or its smallest size since) and at least that much heap is free. Growth is measured on the
    resident size, so freed memory that the next chunk reuses in place costs nothing."""
    global _rss_after_release
    if _threshold_bytes is None:
        return
    resident = resident_bytes() or 0
    _rss_after_release = min(_rss_after_release, resident)
    if resident - _rss_after_release <= _threshold_bytes:
        return
    if _glibc().mallinfo2().fordblks > _threshold_bytes:
        _glibc().malloc_trim(0)
    _rss_after_release = resident_bytes() or 0

"""A clean exit after zarr reads on a loaded machine.

zarr runs its I/O on an event loop in a thread; its exit hook stops the loop, waits 0.2 s for the thread, then
closes the loop anyway, which prints a traceback ("Cannot close a running event loop") when the thread was not
scheduled in time, as happens with several ranks on few cores. Registered after zarr's hook, this one runs first
(exit hooks run last-in, first-out) and waits longer, so zarr's finds the thread finished.
"""

from __future__ import annotations

import atexit

from zarr.core import sync

JOIN_SECONDS = 10.0


def stop_io_thread() -> None:
    """Stop zarr's event loop and wait for its thread (at most ``JOIN_SECONDS``)."""
    loop, thread = sync.loop[0], sync.iothread[0]
    if loop is None or thread is None or loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=JOIN_SECONDS)


atexit.register(stop_io_thread)

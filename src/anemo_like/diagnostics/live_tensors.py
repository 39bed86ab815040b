"""Peak bytes of live tensors created inside a block of code, on any device, without allocator effects.

Process memory (VmHWM) also counts what the allocator keeps after a free and the gaps between live blocks;
this tracker counts only the storages that torch operators create and that are still referenced. It sees every
operator call (forward, backward and checkpoint recomputation) through a ``TorchDispatchMode``.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveTensorTracker(TorchDispatchMode):
    """``with LiveTensorTracker() as t: ...`` then ``t.peak_bytes``: the largest total size, in bytes, of the
    storages created inside the block that were alive at one time. Views and in-place results count nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._sizes: dict[int, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliasing = [r.alias_info is not None for r in func._schema.returns]
        outputs = out if isinstance(out, tuple | list) else (out,)
        for index, tensor in enumerate(tree_leaves(outputs)):
            if isinstance(tensor, torch.Tensor) and not (index < len(aliasing) and aliasing[index]):
                self._track(tensor.untyped_storage())
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self._sizes:
            return
        self._sizes[key] = size
        self.live_bytes += size
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)

    @property
    def peak_mib(self) -> float:
        return self.peak_bytes / 2**20

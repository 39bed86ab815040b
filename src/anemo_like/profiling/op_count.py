"""Aten operators dispatched by a piece of work: a device-independent measure of host overhead.

Every dispatched operator is at least one kernel launch on a GPU (views excepted) plus Python and dispatcher work
on the host, so at the sizes where the GPU is fast the count sets the pace. ``OpCounter`` counts them with a
``TorchDispatchMode`` (forward and backward alike; a custom op such as the Triton graph attention counts as one),
and names the operators that make the host wait for the device.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPERATORS = (
    "aten._local_scalar_dense",  # .item(), float(t), int(t), bool(t)
    "aten.nonzero",
    "aten.unique",
    "aten._unique",
    "aten.masked_select",
    "aten.repeat_interleave.Tensor",
    "aten.equal",
    "aten.is_nonzero",
)
"""Operators that read device memory on the host (their result's size or value is data-dependent)."""


def is_sync(name: str) -> bool:
    """Whether the operator ``name`` (as ``str(func)``: ``aten.nonzero.default``) waits for the device."""
    return name.startswith(SYNC_OPERATORS)


class OpCounter(TorchDispatchMode):
    """Counts the operators dispatched while it is active, by name (``aten.mm.default``, ...)."""

    def __init__(self) -> None:
        super().__init__()
        self.by_name: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.by_name[str(func)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operators dispatched."""
        return sum(self.by_name.values())

    def syncs(self) -> dict[str, int]:
        """The device-to-host synchronising operators among them, by name."""
        return {name: n for name, n in sorted(self.by_name.items()) if is_sync(name)}

    def top(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` most dispatched operators, most first."""
        return self.by_name.most_common(n)


def count_ops(work: Callable[[], object]) -> OpCounter:
    """Run ``work()`` once under an ``OpCounter`` and return the counter."""
    with OpCounter() as counter:
        work()
    return counter

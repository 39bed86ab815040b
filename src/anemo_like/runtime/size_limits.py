"""Refuse, at set-up, sizes whose memory cannot fit: members, batches, rollouts, lead times, dates.

A run's estimate grows with a few settings (``Size``). When the estimate for the configured values is above the
memory available, :func:`check_sizes_fit` raises one ValueError naming the first of them whose lowering alone
makes the run fit, with the largest value that does; when no single one does (several too large at once), the
first that does not fit with the settings after it at their smallest. When nothing fits even with every setting at
its smallest (the model itself), the refusal says so and names the memory the smallest run needs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from anemo_like.runtime.process_memory import AvailableMemory, MemoryCeiling, available_memory, cpu_memory_ceilings

Estimate = Callable[[dict[str, int]], int]
"""Bytes a run needs for given values of its sizes (by key); never smaller for a larger value."""


@dataclass(frozen=True)
class Size:
    """A setting the memory of a run grows with: its config ``key``, its ``value`` as a count (members, samples,
    steps, dates), how the message names it (``subject``, e.g. ``members=300000``) and a count (``shown``), what
    lowers it (``remedy``) and the step its values take (members: a multiple of the instances sharing them)."""

    key: str
    value: int
    subject: str
    shown: Callable[[int], str] = str
    remedy: str = ""
    step: int = 1

    @property
    def lower(self) -> str:
        return self.remedy or f"lower {self.key}"


def run_memory(budget_gb: float | None, budget_key: str, device: torch.device) -> AvailableMemory:
    """The memory a run may use: its budget (``budget_key``, GiB) where set, else what ``device`` has available. A
    CPU budget above what the process could ever use (:func:`cpu_memory_ceilings`) is refused: the allocator, the
    kernel's out-of-memory killer or the job's limit would stop the run first."""
    if not budget_gb:
        return available_memory(device)
    budget = int(budget_gb * 2**30)
    if device.type == "cpu":
        check_budget_below(budget_gb, budget_key, cpu_memory_ceilings())
    return AvailableMemory(budget, budget_key)


def check_budget_below(budget_gb: float, budget_key: str, ceilings: list[MemoryCeiling]) -> None:
    """Raise ValueError naming the lowest of ``ceilings`` when the budget is above it."""
    above = [ceiling for ceiling in ceilings if int(budget_gb * 2**30) > ceiling.memory.bytes]
    if not above:
        return
    lowest = min(above, key=lambda ceiling: ceiling.memory.bytes)
    limit = format_gib(lowest.memory.bytes)
    what = lowest.phrase.format(limit=limit, source=lowest.memory.source)
    raise ValueError(
        f"{budget_key}={budget_gb:g} is more than {what}; set {budget_key} to at most {limit}"
        + (f", or {lowest.remedy}" if lowest.remedy else "")
    )


def format_gib(size: int) -> str:
    """Bytes as GiB (one decimal below 100 GiB), below 0.1 GiB as MiB, below 1 MiB as KiB."""
    gib = size / 2**30
    if size < 2**20:
        return f"{size / 2**10:.0f} KiB"
    return f"{gib:.0f} GiB" if gib >= 100 else f"{gib:.1f} GiB" if gib >= 0.1 else f"{size / 2**20:.0f} MiB"


def largest_fitting(estimate: Estimate, values: dict[str, int], size: Size, available: int) -> int:
    """The largest multiple of ``size.step`` up to ``size.value`` whose estimate, with the other sizes at
    ``values``, fits ``available`` (0: none does)."""
    low, high = 0, size.value // size.step  # low fits (or is 0); above high does not
    while low < high:
        middle = (low + high + 1) // 2
        if estimate({**values, size.key: middle * size.step}) <= available:
            low = middle
        else:
            high = middle - 1
    return low * size.step


def _refused(sizes: Sequence[Size], estimate: Estimate, available: int) -> tuple[Size, int] | None:
    """The size to refuse and the largest of its values that fits; None when the configured values fit, or when
    nothing fits even at the smallest values."""
    values = {size.key: size.value for size in sizes}
    if estimate(values) <= available:
        return None
    for size in sizes:  # the first whose lowering alone fits
        largest = largest_fitting(estimate, values, size, available)
        if largest >= size.step:
            return size, largest
    for i, size in enumerate(sizes):  # several at once: the first too large with those after it at their smallest
        fewer = {**values, **{later.key: later.step for later in sizes[i + 1 :]}}
        if estimate(fewer) > available:
            largest = largest_fitting(estimate, fewer, size, available)
            return (size, largest) if largest >= size.step else None
    return None


def check_sizes_fit(
    sizes: Sequence[Size], estimate: Estimate, *, available: AvailableMemory, what: str, budget_key: str
) -> None:
    """Raise ValueError when ``estimate`` of the configured ``sizes`` is above ``available`` (see the module);
    ``what``: what the estimate counts, for the configured values; ``budget_key``: the setting that gives the
    memory a run may use."""
    refused = _refused(sizes, estimate, available.bytes)
    if refused is None and estimate({s.key: s.step for s in sizes}) > available.bytes:  # not even the smallest
        smallest = estimate({s.key: s.step for s in sizes})
        raise ValueError(
            f"the {format_gib(available.bytes)} available ({available.source}) is less than even the smallest run "
            f"needs (about {format_gib(smallest)}, with {', '.join(s.key for s in sizes)} at their smallest); set "
            f"{budget_key} to at least {format_gib(smallest)}, the memory this run may use"
        )
    if refused is None:
        return
    size, largest = refused
    needed = estimate({s.key: s.value for s in sizes})
    raise ValueError(
        f"{size.subject} needs about {format_gib(needed)} ({what}), more than the {format_gib(available.bytes)} "
        f"available ({available.source}); the largest that fits is {size.shown(largest)}: {size.lower} or set "
        f"{budget_key} to the memory this run may use"
    )

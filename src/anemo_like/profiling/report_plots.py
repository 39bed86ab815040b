"""The two PNGs of a profile report: time per phase, and memory over the timed steps."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from anemo_like.diagnostics.phases import STEP_PHASES, PhaseTotals
from anemo_like.diagnostics.sampler import MemorySample


def _phase_colours(names: list[str]) -> dict[str, tuple]:
    cmap = plt.get_cmap("tab20")
    order = list(STEP_PHASES) + [n for n in names if n not in STEP_PHASES]
    return {name: cmap(i % 20) for i, name in enumerate(order)}


def plot_time_per_phase(phases: dict[str, PhaseTotals], path: Path) -> None:
    """Horizontal bars: wall milliseconds per step of each phase, CPU milliseconds beside them."""
    names = list(phases)
    colours = _phase_colours(names)
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(names) + 1.2))
    y = range(len(names))
    ax.barh(
        [i + 0.2 for i in y],
        [phases[n].wall_s * 1e3 for n in names],
        height=0.4,
        label="wall",
        color=[colours[n] for n in names],
    )
    ax.barh([i - 0.2 for i in y], [phases[n].cpu_s * 1e3 for n in names], height=0.4, label="CPU", color="0.7")
    ax.set_yticks(list(y), names)
    ax.invert_yaxis()
    ax.set(xlabel="milliseconds per step", title="time per phase")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_memory_over_steps(
    samples: list[MemorySample],
    source: str,
    path: Path,
    *,
    categories: tuple[list[float], dict[str, list[float]]] | None = None,
) -> None:
    """Top: sampled memory over the timed steps, shaded by phase. Bottom (when given): tensor memory by category
    over the profiled steps, from torch.profiler's memory timeline."""
    rows = 2 if categories else 1
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3.6 * rows), squeeze=False)
    ax = axes[0][0]
    names = sorted({s.phase for s in samples if s.phase})
    colours = _phase_colours(names)
    seconds = [s.seconds for s in samples]
    ax.plot(seconds, [s.mib for s in samples], color="black", linewidth=0.8)
    start = 0
    for i in range(1, len(samples) + 1):
        if i == len(samples) or samples[i].phase != samples[start].phase:
            if samples[start].phase:
                ax.axvspan(seconds[start], seconds[i - 1], color=colours[samples[start].phase], alpha=0.35, lw=0)
            start = i
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n], alpha=0.35) for n in names]
    order = [n for n in STEP_PHASES if n in names] + [n for n in names if n not in STEP_PHASES]
    ax.legend([handles[names.index(n)] for n in order], order, fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
    ax.set(xlabel="seconds", ylabel="MiB", title=f"memory over the timed steps ({source})")
    if categories:
        times, by_category = categories
        ax = axes[1][0]
        shown = {k: v for k, v in by_category.items() if max(v, default=0) > 0}
        ax.stackplot(times, *shown.values(), labels=list(shown))
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1, 1))
        ax.set(
            xlabel="seconds", ylabel="MiB", title="tensor memory by category over the profiled steps (torch.profiler)"
        )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

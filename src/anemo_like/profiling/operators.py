"""torch.profiler over a few training steps: operator tables, a Chrome/Perfetto trace and a memory timeline."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

TRACE_FILE = "steps.pt.trace.json"
TIMELINE_FILE = "memory_timeline_profiler.json"
# Columns of torch.profiler's exported memory timeline, after the leading unused one (its category order).
TIMELINE_CATEGORIES = (
    "parameter",
    "optimizer state",
    "input",
    "temporary",
    "activation",
    "gradient",
    "autograd detail",
    "unknown",
)


@dataclass
class OperatorRow:
    name: str
    calls: int
    self_ms: float  # on the host (CPU), summed over the profiled steps
    total_ms: float
    device_self_ms: float
    self_memory_bytes: int  # allocated minus freed by the operator itself
    memory_bytes: int  # including children


def _is_python_frame(name: str) -> bool:
    """Python-level events recorded with stacks (``<built-in method ...>``, ``file.py(12): f``): not operators."""
    return name.startswith("<") or ".py(" in name


def operator_rows(prof: profile) -> list[OperatorRow]:
    """One row per operator (aten ops and annotated ranges), Python frames left out."""
    on_device = torch.cuda.is_available()
    rows = []
    for e in prof.key_averages():
        if _is_python_frame(e.key):
            continue
        rows.append(
            OperatorRow(
                name=e.key,
                calls=e.count,
                self_ms=e.self_cpu_time_total / 1e3,
                total_ms=e.cpu_time_total / 1e3,
                device_self_ms=(e.self_device_time_total / 1e3) if on_device else 0.0,
                self_memory_bytes=int(e.self_device_memory_usage if on_device else e.self_cpu_memory_usage),
                memory_bytes=int(e.device_memory_usage if on_device else e.cpu_memory_usage),
            )
        )
    return rows


def top_by_time(rows: list[OperatorRow], n: int) -> list[OperatorRow]:
    return sorted(rows, key=lambda r: r.self_ms + r.device_self_ms, reverse=True)[:n]


def top_by_memory(rows: list[OperatorRow], n: int) -> list[OperatorRow]:
    return sorted((r for r in rows if r.self_memory_bytes > 0), key=lambda r: r.self_memory_bytes, reverse=True)[:n]


def rows_as_dicts(rows: list[OperatorRow]) -> list[dict]:
    return [{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()} for r in rows]


@dataclass
class ProfiledSteps:
    """What one profiler run produced: the operator rows, and the files written."""

    rows: list[OperatorRow]
    trace: Path | None  # None when no step ran under the profiler
    timeline: Path | None  # None when torch could not build the memory timeline
    timeline_error: str | None


def profile_steps(run_step: Callable[[], None], steps: int, output_dir: Path, device: torch.device) -> ProfiledSteps:
    """Run ``run_step`` ``steps`` times under torch.profiler (shapes, memory, stacks) and write the trace and the
    memory timeline by category (parameters, activations, gradients, ...) into ``output_dir``."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, record_shapes=True, profile_memory=True, with_stack=True) as prof:
        for _ in range(steps):
            run_step()
    trace = output_dir / TRACE_FILE
    prof.export_chrome_trace(str(trace))
    timeline: Path | None = output_dir / TIMELINE_FILE
    error = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # torch marks the exporter deprecated in favour of CUDA
            prof.export_memory_timeline(str(timeline), device=str(device))
    except Exception as exc:  # the exporter is best effort: a failure must not lose the rest of the report
        timeline, error = None, f"{type(exc).__name__}: {exc}"
    return ProfiledSteps(operator_rows(prof), trace, timeline, error)


def read_timeline(path: Path) -> tuple[list[float], dict[str, list[float]]]:
    """The exported memory timeline -> (seconds from its start, MiB per category)."""
    times_us, sizes = json.loads(path.read_text())
    start = times_us[0] if times_us else 0
    by_category = {name: [row[i + 1] / 2**20 for row in sizes] for i, name in enumerate(TIMELINE_CATEGORIES)}
    return [(t - start) / 1e6 for t in times_us], by_category

"""The profile report folder: ``report.md`` to read first, JSON/CSV for tools, PNG plots, the trace."""

from __future__ import annotations

import csv
import datetime
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from anemo_like.config.schema import RunConfig
from anemo_like.diagnostics.phases import PhaseTotals
from anemo_like.diagnostics.sampler import MemorySample
from anemo_like.diagnostics.snapshot import write_timeline_csv
from anemo_like.profiling.operators import ProfiledSteps, read_timeline, rows_as_dicts, top_by_memory, top_by_time
from anemo_like.profiling.report_plots import plot_memory_over_steps, plot_time_per_phase

IO_PHASES = ("data loading", "host to device")


@dataclass
class ProfileReport:
    output: Path  # the report folder
    config: RunConfig  # the trainer's: every num_chunks resolved (never auto), the config the doctor reads
    rank: int
    device: str
    phases: dict[str, PhaseTotals]  # per step
    steps: int
    samples_per_second: float
    loader_batches_per_second: float
    parameters: dict[str, int]
    memory_samples: list[MemorySample]
    memory_source: str
    allocator: dict | None  # CUDA: peak reserved and allocated MiB of one step
    snapshot_fallback: str | None  # why there is no CUDA memory snapshot (None: there is one)
    profiled: ProfiledSteps
    system: dict

    @property
    def step_seconds(self) -> float:
        return sum(p.wall_s for p in self.phases.values())

    @property
    def io_seconds(self) -> float:
        """Seconds per step the training loop waits for data (loading + host to device)."""
        return sum(self.phases[p].wall_s for p in IO_PHASES if p in self.phases)

    @property
    def peak_above_step_start_mib(self) -> float:
        return max((p.peak_above_step_start_mib for p in self.phases.values()), default=0.0)

    @property
    def tensor_peak_mib(self) -> float:
        return max((p.tensor_peak_mib for p in self.phases.values()), default=0.0)

    def summary(self) -> dict:
        """Everything in the report as plain JSON-ready values."""
        rows = self.profiled.rows
        top = self.config.diagnostics.profile.top_operators
        return {
            "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "rank": self.rank,
            "device": self.device,
            "steps_timed": self.steps,
            "batch_size": self.config.dataloader.batch_size.train,
            "dataloader_workers": self.config.dataloader.num_workers.train,
            "step_seconds": self.step_seconds,
            "io_seconds_per_step": self.io_seconds,
            "compute_seconds_per_step": self.step_seconds - self.io_seconds,
            "samples_per_second": self.samples_per_second,
            "loader_batches_per_second": self.loader_batches_per_second,
            "peak_above_step_start_mib": self.peak_above_step_start_mib,
            "tensor_peak_mib": self.tensor_peak_mib,
            "phases": {name: asdict(p) for name, p in self.phases.items()},
            "parameters": self.parameters,
            "memory_source": self.memory_source,
            "allocator": self.allocator,
            "cuda_snapshot": None if self.snapshot_fallback else "memory_snapshot.pickle",
            "cuda_snapshot_fallback": self.snapshot_fallback,
            "profiler_memory_timeline": self.profiled.timeline.name if self.profiled.timeline else None,
            "profiler_memory_timeline_error": self.profiled.timeline_error,
            "operators_by_time": rows_as_dicts(top_by_time(rows, top)),
            "operators_by_memory": rows_as_dicts(top_by_memory(rows, top)),
            "system": self.system,
            "config": self.config.model_dump(mode="json"),
        }


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as f:
        if not rows:
            return
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def phase_table(report: ProfileReport) -> str:
    step = report.step_seconds
    lines = [
        "| phase | wall ms / step | CPU ms / step | share of step | process peak MiB | tensor peak MiB |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, p in report.phases.items():
        lines.append(
            f"| {name} | {_ms(p.wall_s)} | {_ms(p.cpu_s)} | {100 * p.wall_s / step:.1f} % | {p.peak_mib:.0f} | "
            f"{p.tensor_peak_mib:.1f} |"
        )
    lines.append(
        f"| **step** | **{_ms(step)}** | {_ms(sum(p.cpu_s for p in report.phases.values()))} | 100 % | "
        f"{max(p.peak_mib for p in report.phases.values()):.0f} | {report.tensor_peak_mib:.1f} |"
    )
    return "\n".join(lines)


def operator_table(rows: list[dict]) -> str:
    lines = ["| operator | calls | self ms | total ms | self MiB |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| `{r['name']}` | {r['calls']} | {r['self_ms']:.1f} | {r['total_ms']:.1f} | "
        f"{r['self_memory_bytes'] / 2**20:.2f} |"
        for r in rows
    ]
    return "\n".join(lines)


def _header(report: ProfileReport, summary: dict) -> str:
    profile, batch = report.config.diagnostics.profile, report.config.dataloader.batch_size.train
    return f"""# Profile report

Rank {report.rank} on {report.device}; {report.steps} timed steps of batch {batch} after
{profile.warmup_steps} warm-up steps; operator tables from {profile.profiled_steps}
further steps under torch.profiler. Written {summary["written"]}."""


def _throughput_section(report: ProfileReport) -> str:
    loader = report.config.dataloader
    rate = report.loader_batches_per_second
    return f"""## Throughput
- **{report.samples_per_second:.2f} samples/s** in training ({_ms(report.step_seconds)} ms per step).
- Dataloader alone: **{rate:.2f} batches/s** ({rate * loader.batch_size.train:.1f}
  samples/s) with `dataloader.num_workers.train={loader.num_workers.train}`.
- Per step, waiting for data (loading + host to device): {_ms(report.io_seconds)} ms; compute:
  {_ms(report.step_seconds - report.io_seconds)} ms."""


def _memory_note(report: ProfileReport, summary: dict) -> str:
    """Where the allocator's own view of memory is: the CUDA snapshot, or what stands in for it."""
    if report.snapshot_fallback is None:
        return "CUDA allocator snapshot: `memory_snapshot.pickle` (open it at https://pytorch.org/memory_viz)."
    timeline = summary["profiler_memory_timeline"] or "not written: " + str(summary["profiler_memory_timeline_error"])
    return (
        f"No CUDA allocator snapshot: {report.snapshot_fallback}. Instead: the memory timeline of "
        f"torch.profiler (`profile_memory=True`) by tensor category, `{timeline}`"
        f" (lower panel of the plot), and {report.memory_source} sampled every 5 ms, `memory_samples.csv` "
        "(upper panel)."
    )


def _phase_section(report: ProfileReport, summary: dict) -> str:
    cpu_tensor_note = (
        "" if report.device.startswith("cuda") else " (on CPU measured in one more step with every operator tracked)"
    )
    return f"""## Time and memory per phase
Time: mean per step over the timed steps. Process memory: the peak during the phase ({report.memory_source});
`phases.csv` also has it above the memory at the start of the step. Tensor peak: tensors created since the step
started and alive at once during the phase, the memory the step needs without allocator
effects{cpu_tensor_note}. Backward phases of checkpointed components include their recomputation.

{phase_table(report)}

![time per phase](time_per_phase.png)

![memory over the timed steps](memory_over_steps.png)

{_memory_note(report, summary)}"""


def _model_and_operators(report: ProfileReport, summary: dict) -> str:
    params = "\n".join(f"| {k} | {v:,} |" for k, v in report.parameters.items())
    return f"""## Model
| component | parameters |
|---|---:|
{params}

## Operators by time (top {len(summary["operators_by_time"])})
{operator_table(summary["operators_by_time"])}

## Operators by memory allocated (top {len(summary["operators_by_memory"])})
{operator_table(summary["operators_by_memory"])}"""


def _system_section(system: dict) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in system["versions"].items() if v)
    env = ", ".join(f"`{k}={v}`" for k, v in system["env"].items()) or "none set"
    return f"""## System
{system["platform"]}, Python {system["python"]}, {system["cpu_count"]} CPUs
({system["torch_threads"]} torch threads), {system["memory_total_gib"]} GiB;
CUDA devices: {", ".join(d["name"] for d in system["cuda_devices"]) or "none"}. Versions: {versions}.
Environment: {env}."""


def _trace_note(report: ProfileReport) -> str:
    trace = report.profiled.trace
    if trace is None:
        return "(no profiler trace: diagnostics.profile.profiled_steps=0)"
    return f"`{trace.name}` (open in https://ui.perfetto.dev or chrome://tracing)"


def _files_section(report: ProfileReport, summary: dict) -> str:
    return f"""## Files
`report.json` (everything above), `phases.csv`, `operators_by_time.csv`, `operators_by_memory.csv`,
`memory_samples.csv`, {_trace_note(report)},
`{summary["profiler_memory_timeline"] or "(no profiler memory timeline)"}`, `time_per_phase.png`,
`memory_over_steps.png`{", `memory_snapshot.pickle`" if report.snapshot_fallback is None else ""}."""


def render_markdown(report: ProfileReport, summary: dict) -> str:
    """``report.md``: throughput, time and memory per phase, model, operators, system, files."""
    sections = [
        _header(report, summary),
        _throughput_section(report),
        _phase_section(report, summary),
        _model_and_operators(report, summary),
        _system_section(report.system),
        _files_section(report, summary),
    ]
    return "\n\n".join(sections) + "\n"


def write_report(report: ProfileReport, output: Path) -> dict:
    """Write every report file into ``output``; returns the JSON summary."""
    summary = report.summary()
    (output / "report.json").write_text(json.dumps(summary, indent=1))
    _write_csv(output / "phases.csv", [{"phase": k, **v} for k, v in summary["phases"].items()])
    _write_csv(output / "operators_by_time.csv", summary["operators_by_time"])
    _write_csv(output / "operators_by_memory.csv", summary["operators_by_memory"])
    write_timeline_csv(report.memory_samples, output / "memory_samples.csv")
    plot_time_per_phase(report.phases, output / "time_per_phase.png")
    categories = read_timeline(report.profiled.timeline) if report.profiled.timeline else None
    plot_memory_over_steps(
        report.memory_samples, report.memory_source, output / "memory_over_steps.png", categories=categories
    )
    (output / "report.md").write_text(render_markdown(report, summary))
    return summary

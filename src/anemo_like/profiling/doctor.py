"""The performance doctor: reads a profile report and says which knob to turn, memory first, then speed.

Memory findings use each phase's tensor peak (tensors created in the step and alive at once: the memory a
GPU's allocator would have to hold). Every finding carries the measured figure behind it and the exact override
to try. The flowchart: memory — allocator fragmentation, then a component that keeps its activations until
backward (recompute it), else the component that holds the peak (encoder/decoder: mapper chunks; processor:
processor chunks), then what is left when chunking is exhausted; speed — waiting for data (dataloader workers),
attention backend, recomputation that memory does not need (only when memory found nothing).

The config is the run's resolved one (``trainer.config``, ``ProfileReport.config``): chunk counts, never ``auto``.
"""

from __future__ import annotations

from dataclasses import dataclass

from anemo_like.config.schema import RunConfig

MAPPERS = ("encoder", "decoder")
COMPONENTS = (*MAPPERS, "processor")
MAX_USEFUL_MAPPER_CHUNKS = 64  # beyond this, chunks mostly re-embed the same source rows
IO_SHARE_LIMIT = 0.10  # of the step spent waiting for data
LOW_PRESSURE = 0.25  # of the device's memory: below this, memory findings say memory is not short
DOMINANT = 1.25  # a component "holds the peak" when its peak is this much above every other phase's


@dataclass(frozen=True)
class Finding:
    area: str  # "memory" or "speed"
    finding: str
    evidence: str
    override: str | None  # what to put on the command line (or in the environment); None: no knob left

    def markdown(self) -> str:
        action = f"\n  - try: `{self.override}`" if self.override else ""
        return f"- **{self.area}: {self.finding}**\n  - measured: {self.evidence}{action}"


def _phase_peak(summary: dict, prefix: str) -> tuple[float, str | None]:
    """Largest tensor peak among phases named ``prefix ...``, and that phase."""
    best, name = 0.0, None
    for phase, p in summary["phases"].items():
        if phase.startswith(prefix + " ") and p["tensor_peak_mib"] > best:
            best, name = p["tensor_peak_mib"], phase
    return best, name


def _device_memory_mib(summary: dict) -> float | None:
    devices = summary["system"]["cuda_devices"]
    if summary["device"].startswith("cuda") and devices:
        return devices[0]["memory_gib"] * 1024
    total = summary["system"]["memory_total_gib"]
    return None if total is None else total * 1024


def _require_resolved(config: RunConfig) -> None:
    """The doctor reads chunk counts: a config with ``num_chunks: auto`` left in is the caller's mistake."""
    unresolved = [f"model.{n}" for n in COMPONENTS if getattr(config.model, n).num_chunks == "auto"]
    if unresolved:
        raise ValueError(
            f"the doctor needs the run's resolved config, but {', '.join(unresolved)} num_chunks is still 'auto': "
            "pass the trainer's config (trainer.config, or the profile report's config), where auto is resolved"
        )


def _fragmentation(summary: dict) -> Finding | None:
    """CUDA: the allocator reserves much more than the tensors need and expandable segments are off."""
    allocator = summary.get("allocator") or {}
    reserved, allocated = allocator.get("peak_reserved_mib"), allocator.get("peak_allocated_mib")
    if not (reserved and allocated and (reserved - allocated) / reserved > 0.2):
        return None
    if "expandable_segments:True" in summary["system"]["env"].get("PYTORCH_CUDA_ALLOC_CONF", ""):
        return None
    return Finding(
        "memory",
        "the CUDA allocator holds much more than the tensors need (fragmentation)",
        f"peak reserved {reserved:.0f} MiB vs peak allocated {allocated:.0f} MiB "
        f"({100 * (reserved - allocated) / reserved:.0f} % reserved but unallocated)",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
    )


def _share_of_device(summary: dict, step_peak: float) -> str:
    """The step's tensor peak as a share of the device's memory ("" when the memory is unknown)."""
    device_mib = _device_memory_mib(summary)
    if not device_mib:
        return ""
    text = f"; that peak is {100 * step_peak / device_mib:.1f} % of the device's memory"
    if step_peak < LOW_PRESSURE * device_mib:
        text += " (memory is not short here: act on this when you need the room, e.g. for a larger model)"
    return text


def _component_shares(summary: dict, peaks: dict[str, tuple[float, str | None]], step_peak: float) -> str:
    """The evidence every memory finding quotes: the mappers' and the processor's share of the step's peak."""
    mapper_peak = max(peaks[m][0] for m in MAPPERS)
    processor_peak = peaks["processor"][0]
    return (
        f"encoder/decoder phases peak at {mapper_peak:.0f} MiB of tensors ({100 * mapper_peak / step_peak:.0f} % "
        f"of the step's peak of {step_peak:.0f} MiB); processor phases at {processor_peak:.0f} MiB "
        f"({100 * processor_peak / step_peak:.0f} %){_share_of_device(summary, step_peak)}"
    )


def _kept_activations(summary: dict, config: RunConfig, step_peak: float, share: str) -> Finding | None:
    """A component without recomputation whose forward keeps a large part of the peak until backward."""
    kept = {
        name: summary["phases"].get(f"{name} forward", {}).get("retained_mib", 0.0)
        for name in COMPONENTS
        if not getattr(config.model, name).gradient_checkpointing
    }
    if not kept:
        return None
    keeper = max(kept, key=kept.get)
    if kept[keeper] < 0.4 * step_peak:
        return None
    chunks = f" model.{keeper}.num_chunks=4" if keeper in MAPPERS else ""
    return Finding(
        "memory",
        f"the {keeper} keeps its activations from forward to backward: recompute it",
        f"its forward keeps {kept[keeper]:.0f} MiB of tensors until backward "
        f"({100 * kept[keeper] / step_peak:.0f} % of the step's peak); {share}",
        f"model.{keeper}.gradient_checkpointing=true{chunks}",
    )


def _peak_outside(summary: dict, group: tuple[str, ...]) -> float:
    """Largest tensor peak among the phases of components outside ``group`` (data loading, loss, ... included)."""
    phases = summary["phases"].items()
    return max((p["tensor_peak_mib"] for name, p in phases if name.split()[0] not in group), default=0.0)


def _mapper_chunks(config: RunConfig, holder: str, peaks: dict, rest: float, where: str) -> Finding:
    """The encoder or decoder holds the peak: four times the chunks of every mapper that dominates."""
    current = getattr(config.model, holder).num_chunks
    if current >= MAX_USEFUL_MAPPER_CHUNKS:
        return _nothing_left(where, f"{holder} num_chunks is already {current}")
    targets = [m for m in MAPPERS if peaks[m][0] >= DOMINANT * rest] or [holder]
    counts = {m: min(MAX_USEFUL_MAPPER_CHUNKS, 4 * getattr(config.model, m).num_chunks) for m in targets}
    now = ", ".join(f"model.{m}.num_chunks={getattr(config.model, m).num_chunks}" for m in targets)
    return Finding(
        "memory",
        f"the {holder} holds the peak: raise the mapper chunks (or set them to `auto`)",
        f"{where}; the run has {now}",
        " ".join(f"model.{m}.num_chunks={c}" for m, c in counts.items()),
    )


def _processor_chunks(config: RunConfig, where: str) -> Finding:
    """The processor holds the peak: twice the checkpoint segments, up to one per layer."""
    processor = config.model.processor
    if processor.num_chunks >= processor.num_layers:
        return _nothing_left(where, "the processor is already checkpointed layer by layer")
    return Finding(
        "memory",
        "the processor holds the peak: checkpoint it in more, smaller segments",
        f"{where}; the run has model.processor.num_chunks={processor.num_chunks} of {processor.num_layers} layers",
        f"model.processor.num_chunks={min(processor.num_layers, 2 * processor.num_chunks)}",
    )


def _peak_holder(summary: dict, config: RunConfig, peaks: dict, step_peak: float, share: str) -> Finding | None:
    """Chunking advice for the component whose phases hold the step's peak, when it is at least ``DOMINANT`` times
    every other phase's."""
    holder = max(peaks, key=lambda n: peaks[n][0])
    rest = _peak_outside(summary, MAPPERS if holder in MAPPERS else ("processor",))
    if peaks[holder][0] < step_peak * 0.999 or peaks[holder][0] < DOMINANT * rest:
        return None
    where = f"{share}; the peak is in {peaks[holder][1]}"
    if holder in MAPPERS:
        return _mapper_chunks(config, holder, peaks, rest, where)
    return _processor_chunks(config, where)


def memory_findings(summary: dict, config: RunConfig) -> list[Finding]:
    """Memory, in the flowchart's order: fragmentation; then a component that keeps its activations, or else the
    component that holds the peak (chunks, or nothing left to chunk). ``config`` must be resolved (no ``auto``)."""
    _require_resolved(config)
    fragmentation = _fragmentation(summary)
    findings = [fragmentation] if fragmentation else []
    step_peak = summary["tensor_peak_mib"]
    if step_peak <= 0:
        return findings
    peaks = {name: _phase_peak(summary, name) for name in COMPONENTS}
    share = _component_shares(summary, peaks, step_peak)
    kept = _kept_activations(summary, config, step_peak, share)
    component = kept or _peak_holder(summary, config, peaks, step_peak, share)
    return findings + ([component] if component else [])


def _nothing_left(share: str, why: str) -> Finding:
    return Finding(
        "memory",
        f"no chunking left to turn ({why}): shrink the batch or the model, or shard the model over more devices "
        "(system.hardware.num_gpus_per_model: edges with halos, or heads)",
        share,
        None,
    )


def speed_findings(summary: dict, config: RunConfig) -> list[Finding]:
    findings: list[Finding] = []
    step, io, compute = summary["step_seconds"], summary["io_seconds_per_step"], summary["compute_seconds_per_step"]
    loader_rate = summary["loader_batches_per_second"]
    workers = config.dataloader.num_workers.train
    io_bound = io > IO_SHARE_LIMIT * step or (loader_rate > 0 and 1 / loader_rate > compute)
    if io_bound:
        cpus = summary["system"]["cpu_affinity"] or summary["system"]["cpu_count"] or 1
        suggestion = min(8, max(1, cpus - 1)) if workers == 0 else min(2 * workers, max(workers + 1, cpus - 1))
        evidence = (
            f"waiting for data takes {1e3 * io:.1f} ms of each {1e3 * step:.1f} ms step ({100 * io / step:.0f} %); "
            f"the dataloader alone reads {loader_rate:.1f} batches/s ({1e3 / loader_rate:.1f} ms per batch) while a "
            f"step computes in {1e3 * compute:.1f} ms, with num_workers.train={workers}"
        )
        slower = loader_rate > 0 and 1 / loader_rate > compute
        what = (
            "data loading is slower than compute"
            if slower
            else f"the step waits for data {100 * io / step:.0f} % of the time"
        )
        if suggestion > workers:
            findings.append(
                Finding(
                    "speed",
                    f"{what}: read in parallel worker processes",
                    evidence,
                    f"dataloader.num_workers.train={suggestion}",
                )
            )
        else:
            findings.append(Finding("speed", f"{what}, and every CPU already has a worker", evidence, None))
    if config.model.graph_attention_backend == "reference":
        findings.append(
            Finding(
                "speed",
                "the reference attention backend keeps every per-edge tensor and runs op by op",
                f"step {1e3 * step:.1f} ms, tensor peak {summary['tensor_peak_mib']:.0f} MiB",
                "model.graph_attention_backend=torch",
            )
        )
    return findings


def recomputation_findings(summary: dict, config: RunConfig) -> list[Finding]:
    """Checkpointing costs a second forward; when the peak is a small part of the device, it buys nothing."""
    device_mib = _device_memory_mib(summary)
    step_peak = summary["tensor_peak_mib"]
    recomputed = [n for n in ("encoder", "processor", "decoder") if getattr(config.model, n).gradient_checkpointing]
    if not recomputed or not device_mib or step_peak > 0.05 * device_mib:
        return []
    forward = sum(p["wall_s"] for n, p in summary["phases"].items() if n.endswith(" forward"))
    backward = sum(p["wall_s"] for n, p in summary["phases"].items() if n.endswith(" backward"))
    return [
        Finding(
            "speed",
            "activation checkpointing recomputes the forward pass though memory is plentiful",
            f"the step's tensor peak, {step_peak:.0f} MiB, is {100 * step_peak / device_mib:.1f} % of the "
            f"device's memory; backward takes {backward / max(forward, 1e-9):.1f}x the forward time",
            " ".join(f"model.{n}.gradient_checkpointing=false" for n in recomputed),
        )
    ]


def diagnose(summary: dict, config: RunConfig) -> list[Finding]:
    """All findings for a report summary (``report.json``) of a run with ``config``, memory first."""
    memory = memory_findings(summary, config)
    return memory + speed_findings(summary, config) + ([] if memory else recomputation_findings(summary, config))


def render(findings: list[Finding]) -> str:
    if not findings:
        return "## Doctor\nNothing to turn: no phase dominates memory and the step does not wait for data.\n"
    return "## Doctor\n" + "\n".join(f.markdown() for f in findings) + "\n"

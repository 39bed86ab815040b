"""anemo-profile: the report files, the phase clock, the memory snapshot recorder (CPU fallback and a mocked CUDA
path) and the doctor's rules on measured reports."""

from __future__ import annotations

import csv
import json
import logging
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from conftest import TINY_MODEL

from anemo_like.diagnostics.phases import STEP_PHASES, PhaseClock
from anemo_like.diagnostics.snapshot import SNAPSHOT_FILE, TIMELINE_FILE, MemorySnapshotRecorder
from anemo_like.profiling.doctor import diagnose, memory_findings
from anemo_like.profiling.run import profile_training
from anemo_like.training.trainer import Trainer

QUICK_PROFILE = [
    "diagnostics.profile.warmup_steps=1",
    "diagnostics.profile.steps=2",
    "diagnostics.profile.profiled_steps=1",
    "diagnostics.profile.loader_batches=3",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_anemo_profile_writes_every_report_file(tmp_path, cache_dir):
    run = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "anemo_like.cli.profile",
            "--doctor",
            *TINY_MODEL,
            *QUICK_PROFILE,
            f"system.paths.output={run}",
            f"system.paths.cache={cache_dir}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = run / "profile"
    summary = json.loads((report / "report.json").read_text())
    assert list(summary["phases"]) == list(STEP_PHASES)
    for name, phase in summary["phases"].items():
        assert phase["wall_s"] > 0 and phase["cpu_s"] >= 0 and phase["peak_mib"] > 0, name
    assert summary["tensor_peak_mib"] > 0
    assert summary["samples_per_second"] > 0 and summary["loader_batches_per_second"] > 0
    assert summary["parameters"]["total"] == sum(v for k, v in summary["parameters"].items() if k != "total")
    assert summary["cuda_snapshot"] is None and "CUDA allocations only" in summary["cuda_snapshot_fallback"]

    phases = read_csv(report / "phases.csv")
    assert [row["phase"] for row in phases] == list(STEP_PHASES)
    by_time = read_csv(report / "operators_by_time.csv")
    assert by_time and all(float(row["self_ms"]) > 0 for row in by_time)
    assert any(row["name"].startswith("aten::") for row in by_time)
    assert all(int(row["self_memory_bytes"]) > 0 for row in read_csv(report / "operators_by_memory.csv"))
    samples = read_csv(report / "memory_samples.csv")
    assert len(samples) > 1 and all(float(row["memory_mib"]) > 0 for row in samples)  # how many: the step's speed
    times, sizes = json.loads((report / "memory_timeline_profiler.json").read_text())
    assert len(times) == len(sizes) > 10
    trace = json.loads((report / "steps.pt.trace.json").read_text())
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"])
    for png in ("time_per_phase.png", "memory_over_steps.png"):
        assert (report / png).read_bytes()[:8] == PNG_MAGIC
    text = (report / "report.md").read_text()
    for phase in STEP_PHASES:
        assert f"| {phase} |" in text
    assert "No CUDA allocator snapshot" in text and "## Doctor" in text
    assert (report / "doctor.md").exists()


def test_phase_clock_splits_forward_and_backward_by_component(compose_run, tmp_path):
    trainer = Trainer(compose_run(tmp_path, ["model.encoder.num_chunks=2"]))
    from anemo_like.diagnostics.phases import instrument_components

    handles = instrument_components(trainer.model, trainer.clock)
    batch = trainer.data.train[0].unsqueeze(0)
    trainer.clock.recording = True
    for _ in range(2):
        trainer.clock.start_step("data loading")
        trainer.clock.switch("host to device")
        trainer.train_step(batch)
        trainer.clock.switch(None)
    phases = trainer.clock.per_step()
    assert list(phases) == list(STEP_PHASES)
    assert all(p.wall_s > 0 for p in phases.values())
    # each component's forward and backward entered once per step (the decoder's backward twice: before
    # loss.backward and when its output's gradient is ready)
    assert phases["encoder forward"].entries == 2 and phases["processor backward"].entries == 2
    for h in handles:
        h.remove()
    trainer.clock.recording = False
    trainer.clock.switch("anything")  # not recording: no effect
    assert "anything" not in trainer.clock.totals


def test_clock_without_recording_costs_nothing_in_training(compose_run, tmp_path):
    clock = PhaseClock(torch.device("cpu"))
    clock.start_step("data loading")
    clock.switch("loss")
    clock.switch(None)
    assert clock.totals == {} and clock.steps == 0


def test_snapshot_recorder_on_cpu_says_why_and_writes_a_timeline(compose_run, tmp_path, caplog):
    overrides = [
        "training.max_steps=5",
        "training.val_every_n_steps=5",
        "diagnostics.plots=false",
        "diagnostics.memory_snapshot.enabled=true",
        "diagnostics.memory_snapshot.warmup=1",
        "diagnostics.memory_snapshot.steps=2",
    ]
    with caplog.at_level(logging.WARNING, logger="anemo_like.diagnostics.snapshot"):
        Trainer(compose_run(tmp_path, overrides)).fit()
    assert any("CUDA allocations only, and this run is on cpu" in r.getMessage() for r in caplog.records)
    rows = read_csv(tmp_path / "memory_snapshot" / TIMELINE_FILE)
    assert rows and all(float(r["memory_mib"]) > 0 for r in rows)
    assert not (tmp_path / "memory_snapshot" / SNAPSHOT_FILE).exists()


def test_snapshot_recorder_cuda_path_calls_the_allocator_api_in_order(tmp_path, monkeypatch):
    calls = mock.Mock()
    calls._dump_snapshot.side_effect = lambda path: Path(path).write_bytes(b"snapshot")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", calls._record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", calls._dump_snapshot)
    recorder = MemorySnapshotRecorder(
        device=torch.device("cuda"), output_dir=tmp_path, warmup=2, steps=3, max_entries=1234
    )
    for index in range(8):
        recorder.step_started(index)
        if index == 2:
            assert calls.mock_calls == [mock.call._record_memory_history(max_entries=1234)]
    recorder.close()
    assert calls.mock_calls == [
        mock.call._record_memory_history(max_entries=1234),
        mock.call._dump_snapshot(str(tmp_path / SNAPSHOT_FILE)),
        mock.call._record_memory_history(enabled=None),
    ]
    assert recorder.written == tmp_path / SNAPSHOT_FILE and recorder.written.read_bytes() == b"snapshot"


def test_snapshot_recorder_cuda_path_falls_back_when_the_api_raises(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def refuse(**_kwargs):
        raise RuntimeError("record_context_cpp is not supported")

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", refuse)
    recorder = MemorySnapshotRecorder(
        device=torch.device("cuda"), output_dir=tmp_path, warmup=0, steps=1, max_entries=10
    )
    monkeypatch.setattr("anemo_like.diagnostics.sampler.MemorySampler._read_mib", lambda self: 1.0)
    recorder.step_started(0)
    recorder.step_started(1)
    assert "record_context_cpp is not supported" in recorder.fallback_reason
    assert recorder.written == tmp_path / TIMELINE_FILE


def measured_report(run_dir: Path, cache_dir: Path, overrides: list[str]):
    """Profile summary and config of the tiny quickstart model at 64 channels with unchunked mappers; the config is
    the report's, the one ``anemo-profile --doctor`` hands the doctor."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from anemo_like.config import config_dir, validate_config

    base = [*TINY_MODEL, *QUICK_PROFILE, "model.num_channels=64", "model.encoder.num_chunks=1"]
    paths = [f"system.paths.output={run_dir}", f"system.paths.cache={cache_dir}"]
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="quickstart", overrides=[*base, *overrides, *paths])
    config = validate_config(OmegaConf.to_container(cfg, resolve=True))
    report = profile_training(config, trainer=Trainer(config))
    return report.summary(), report.config


@pytest.fixture(scope="module")
def unrecomputed_report(tmp_path_factory, cache_dir):
    """The quickstart's settings: no chunks, no recomputation."""
    return measured_report(tmp_path_factory.mktemp("unrecomputed"), cache_dir, [])


RECOMPUTE = [f"model.{c}.gradient_checkpointing=true" for c in ("encoder", "processor", "decoder")]


@pytest.fixture(scope="module")
def recomputed_report(tmp_path_factory, cache_dir):
    """Every component recomputed in backward, mappers in one chunk: the decoder's recomputation is the peak."""
    return measured_report(tmp_path_factory.mktemp("recomputed"), cache_dir, RECOMPUTE)


@pytest.fixture(scope="module")
def auto_report(tmp_path_factory, cache_dir):
    """The recomputed run with every ``num_chunks: auto`` and a budget to spare (auto picks the fewest chunks);
    no step under torch.profiler (``profiled_steps=0``, as on operational grids)."""
    auto = [f"model.{c}.num_chunks=auto" for c in ("encoder", "processor", "decoder")]
    overrides = [*RECOMPUTE, *auto, "system.hardware.memory_budget_gb=8", "diagnostics.profile.profiled_steps=0"]
    return measured_report(tmp_path_factory.mktemp("auto"), cache_dir, overrides)


def test_doctor_recommends_recomputation_when_a_mapper_keeps_its_activations(unrecomputed_report):
    summary, config = unrecomputed_report
    memory = [f for f in diagnose(summary, config) if f.area == "memory"]
    assert memory, summary["phases"]
    assert "keeps its activations" in memory[0].finding and "encoder/decoder phases peak at" in memory[0].evidence
    assert memory[0].override.endswith("gradient_checkpointing=true model.decoder.num_chunks=4") or memory[
        0
    ].override.endswith("gradient_checkpointing=true model.encoder.num_chunks=4")


def test_doctor_recommends_mapper_chunks_when_a_mapper_holds_the_peak(recomputed_report):
    summary, config = recomputed_report
    memory = [f for f in diagnose(summary, config) if f.area == "memory"]
    assert memory, summary["phases"]
    assert "raise the mapper chunks" in memory[0].finding
    assert "% of the step's peak" in memory[0].evidence and "the peak is in decoder" in memory[0].evidence
    assert "model.decoder.num_chunks=4" in memory[0].override


def test_doctor_advises_from_the_resolved_chunks_of_an_auto_run(auto_report):
    # anemo-profile --doctor used to hand the doctor the config as composed, whose "auto" met `"auto" < 64`
    summary, config = auto_report
    assert summary["operators_by_time"] == [] and "profiled_steps=0" in summary["profiler_memory_timeline_error"]
    memory = memory_findings(summary, config)
    assert memory, summary["phases"]
    resolved = config.model.decoder.num_chunks
    assert isinstance(resolved, int) and summary["config"]["model"]["decoder"]["num_chunks"] == resolved
    assert "raise the mapper chunks" in memory[0].finding and "the peak is in decoder" in memory[0].evidence
    assert "; the run has " in memory[0].evidence and memory[0].evidence.endswith(
        f"model.decoder.num_chunks={resolved}"
    )
    assert f"model.decoder.num_chunks={4 * resolved}" in memory[0].override
    composed = config.model.model_copy(
        update={c: getattr(config.model, c).model_copy(update={"num_chunks": "auto"}) for c in ("encoder", "decoder")}
    )
    with pytest.raises(ValueError, match=r"model.encoder, model.decoder num_chunks is still 'auto'"):
        memory_findings(summary, config.model_copy(update={"model": composed}))


def test_doctor_recommends_workers_when_loading_is_slower_than_compute(recomputed_report):
    summary, config = recomputed_report
    slow_io = {**summary, "io_seconds_per_step": summary["step_seconds"] * 0.6, "loader_batches_per_second": 0.5}
    findings = [f for f in diagnose(slow_io, config) if f.area == "speed"]
    assert findings and findings[0].override and findings[0].override.startswith("dataloader.num_workers.train=")
    assert "with num_workers.train=0" in findings[0].evidence
    fast_io = {**summary, "io_seconds_per_step": 0.0, "loader_batches_per_second": 1e6}
    assert not [f for f in diagnose(fast_io, config) if (f.override or "").startswith("dataloader.")]


def test_report_folder_follows_the_launch_rank(compose_run, tmp_path, monkeypatch):
    from anemo_like.profiling.run import report_dir

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    config = compose_run(tmp_path, [])
    assert report_dir(config, 0, tmp_path) == tmp_path / "profile"
    assert report_dir(config, 1, tmp_path) is None  # rank 0 reports alone by default
    everyone = compose_run(tmp_path, ["diagnostics.profile.all_ranks=true", f"diagnostics.profile.output={tmp_path}/p"])
    assert report_dir(everyone, 3, tmp_path) == tmp_path / "p" / "rank3"

    from anemo_like.distributed.environment import launch_rank

    assert launch_rank() == 0
    monkeypatch.setenv("SLURM_PROCID", "5")
    assert launch_rank() == 5
    monkeypatch.setenv("RANK", "2")  # torchrun's variable wins over SLURM's
    assert launch_rank() == 2
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two' is not an integer rank"):
        launch_rank()

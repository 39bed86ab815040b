"""The GPU proof kit's CPU dry run (``gpu_check.py --device cpu --quick``): every section runs or says why not, and
both report files are written, so the kit cannot rot between the rare GPU runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
SECTIONS = [
    "environment",
    "tests",
    "step_time",
    "anchor",
    "attention",
    "train",
    "bench",
    "profile",
    "step_time_more",
    "targets",
]
EXPECTED = {"tests": "skip", "anchor": "skip", "targets": "skip", "step_time_more": "skip"}
"""Sections with nothing to do on a CPU: no CUDA for the gpu tests and the anchor, so no ratio to compute; the
further step-time runs are left out of the quick run. Every other section passes."""


def test_cpu_dry_run_writes_every_section(tmp_path, cache_dir) -> None:
    """With the session's cache: the built-in dataset is generated once for all tests."""
    command = [sys.executable, str(BENCHMARKS / "gpu" / "gpu_check.py"), "--device", "cpu", "--quick", "--wheels", ""]
    done = subprocess.run(
        [*command, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), "--cache", str(cache_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "gpu_report.json").read_text())
    statuses = {s["name"]: s["status"] for s in report["sections"]}
    assert list(statuses) == SECTIONS
    assert statuses == {name: EXPECTED.get(name, "pass") for name in SECTIONS}, report["sections"]
    markdown = (tmp_path / "out" / "gpu_report.md").read_text()
    for name, status in statuses.items():
        assert f"## {name}: {status}" in markdown
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu_report.json", "gpu_report.md", "gpu_tests.xml"]
    sections = {s["name"]: s for s in report["sections"]}
    assert sections["tests"]["data"]["counts"]["skipped"] > 10 and sections["tests"]["data"]["counts"]["passed"] == 0
    runs = sections["step_time"]["data"]["runs"]
    assert [(r["case"], r["backend"], r["precision"]) for r in runs] == [
        ("tiny", "triton", "bf16-mixed"),  # torch fallback on CPU
        ("tiny-best", "triton", "bf16-mixed"),
    ]
    assert runs[0]["step_s_median"] > 0 and runs[0]["loss_finite"]
    assert runs[1]["skipped"] == "CUDA graphs need a CUDA device" and "--cuda-graphs" in runs[1]["flags"]
    assert sections["train"]["data"]["samples_per_s"] > 0 and sections["bench"]["data"]["full_samples_per_s"] > 0
    assert sections["environment"]["data"]["cuda_available"] is False
    assert "Doctor" in sections["profile"]["data"]["doctor"]


def test_sections_and_tests_k_choose_what_runs(tmp_path) -> None:
    """``--sections`` runs only the sections named (the others say they were not asked for) and ``--tests-k``
    passes its expression to pytest; an unknown section is refused by name."""
    command = [sys.executable, str(BENCHMARKS / "gpu" / "gpu_check.py"), "--device", "cpu", "--quick", "--wheels", ""]
    command += ["--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")]
    done = subprocess.run(
        [*command, "--sections", "environment,tests", "--tests-k", "cuda_graph_training_step"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sections = {s["name"]: s for s in json.loads((tmp_path / "out" / "gpu_report.json").read_text())["sections"]}
    assert sections["environment"]["status"] == "pass"
    assert sections["tests"]["data"]["counts"] == {"passed": 0, "failed": 0, "error": 0, "skipped": 1}
    for name in ("step_time", "anchor", "attention", "train", "bench", "profile", "step_time_more"):
        assert sections[name]["status"] == "skip" and "not asked for" in sections[name]["note"], sections[name]
    refused = subprocess.run([*command, "--sections", "step_time,warp"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--sections: unknown warp" in refused.stderr
    assert "Traceback" not in refused.stderr

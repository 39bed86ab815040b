"""The benchmark scripts run at a tiny size and print one JSON line with their fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = ["--grid", "12x24", "--mesh-res", "1", "--channels", "16", "--layers", "2", "--heads", "4"]


def run(script: str, *flags: str) -> dict:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *TINY, *flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    return json.loads(line)


def test_sharding_benchmark_counts_bytes_per_strategy() -> None:
    report = run("sharding.py", "--processor-chunks", "2", "--ranks", "1,2", "--steps", "1", "--num-chunks", "2")
    settings = {(s["ranks_per_model"], s["strategy"]): s for s in report["settings"]}
    assert set(settings) == {(1, "none"), (2, "edges"), (2, "heads")}
    assert settings[(1, "none")]["bytes_per_step_all_ranks"] == {"activations": 0, "gradients": 0}
    edges, heads = settings[(2, "edges")], settings[(2, "heads")]
    assert 0 < edges["bytes_per_step_all_ranks"]["activations"] < heads["bytes_per_step_all_ranks"]["activations"]
    assert edges["bytes_per_step_all_ranks"]["gradients"] == heads["bytes_per_step_all_ranks"]["gradients"] > 0
    assert [r["rank"] for r in edges["per_rank"]] == [0, 1]
    assert all(r["step_cpu_s"] > 0 and r["live_tensor_peak_mib"] > 0 for r in edges["per_rank"])


def test_attention_benchmark_lists_every_backend() -> None:
    report = run("attention.py", "--window", "4", "--steps", "1", "--skip-model")
    rows = {(r["attention"], r["backend"]): r for r in report["backends"]}
    assert set(rows) == {
        ("graph", "torch"), ("graph", "reference"), ("graph", "triton"),
        ("sliding_window", "flash_attention"), ("sliding_window", "scaled_dot_product_attention"),
        ("sliding_window", "reference"),
    }  # fmt: skip
    assert "skipped" in rows[("sliding_window", "flash_attention")]
    assert all({"wall_s", "cpu_s", "peak_mib"} <= set(r) for r in rows.values() if "skipped" not in r)
    assert report["memory_measure"] == "live_tensors" and report["model"] == []


def test_throughput_benchmark_reports_every_setting(tmp_path, cache_dir) -> None:
    from conftest import TINY_MODEL

    command = [sys.executable, str(BENCHMARKS / "throughput.py"), "--dataset", "builtin", "--config-name", "quickstart"]
    flags = ["--repeats", "1", "--batches", "1", "--workers", "0", "--precisions", "32", "bf16-mixed"]  # nargs last
    overrides = [*TINY_MODEL, "diagnostics.bench.warmup_batches=0", f"system.paths.cache={cache_dir}"]
    done = subprocess.run([*command, *overrides, *flags], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert set(report["default_samples_per_s"]) == {"io", "synthetic", "full"}
    assert set(report["io_samples_per_s"]) == {"workers=0 pin_memory=true", "workers=0 pin_memory=false"}
    assert set(report["full_samples_per_s"]) == {
        "precision=32", "precision=bf16-mixed", "workers=1 prefetch_factor=1", "workers=1 prefetch_factor=2"
    }  # fmt: skip
    assert all(v > 0 for v in report["io_samples_per_s"].values()) and report["default_bounds"]


def test_attention_benchmark_alternates_eager_and_compiled_model_steps() -> None:
    report = run("attention.py", "--steps", "2", "--skip-backends", "--compile", "torch.nn.LayerNorm")
    assert report["backends"] == []
    eager, compiled = report["model"]
    assert eager["compile"] == [] and compiled["compile"] == ["torch.nn.LayerNorm"]
    assert len(compiled["speedup_vs_eager_pairs"]) == 2 and compiled["speedup_vs_eager"] > 0
    assert all(row["cpu_s"] > 0 and row["peak_mib"] > 0 for row in (eager, compiled))


def test_step_time_runs_each_precision() -> None:
    for precision in ("32", "bf16-mixed"):
        report = run("step_time.py", "--steps", "1", "--warmup", "1", "--precision", precision)
        assert report["args"]["precision"] == precision and report["step_cpu_s_median"] > 0

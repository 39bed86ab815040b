"""The benchmark scripts run at a tiny size and print one JSON line with their fields."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TINY = ["--grid", "12x24", "--mesh-res", "1", "--channels", "16", "--layers", "2", "--heads", "4"]


def run(script: str, *flags: str) -> dict:
    """``benchmarks/SCRIPT`` (``folder/name.py``) at the tiny size; its one JSON line."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *TINY, *flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    return json.loads(line)


def test_sharding_benchmark_counts_bytes_per_strategy() -> None:
    report = run(
        "scaling/sharding.py", "--processor-chunks", "2", "--ranks", "1,2", "--steps", "1", "--num-chunks", "2"
    )
    settings = {(s["ranks_per_model"], s["strategy"]): s for s in report["settings"]}
    assert set(settings) == {(1, "none"), (2, "edges"), (2, "heads")}
    assert settings[(1, "none")]["bytes_per_step_all_ranks"] == {"activations": 0, "gradients": 0}
    edges, heads = settings[(2, "edges")], settings[(2, "heads")]
    assert 0 < edges["bytes_per_step_all_ranks"]["activations"] < heads["bytes_per_step_all_ranks"]["activations"]
    assert edges["bytes_per_step_all_ranks"]["gradients"] == heads["bytes_per_step_all_ranks"]["gradients"] > 0
    assert [r["rank"] for r in edges["per_rank"]] == [0, 1]
    assert all(r["step_cpu_s"] > 0 and r["live_tensor_peak_mib"] > 0 for r in edges["per_rank"])


def test_sharded_inference_benchmark_reports_every_rank() -> None:
    report = run("scaling/sharded_inference.py", "--ranks", "1", "2", "--lead-time", "12h")
    assert {p: len(peaks) for p, peaks in report["per_rank_peak_mib"].items()} == {"1": 1, "2": 2}
    assert all(mib > 0 for peaks in report["per_rank_peak_mib"].values() for mib in peaks)
    assert report["peak_ratio"]["1"] == 1.0 and set(report["forecast_ratio"]) == {"1", "2"}


def test_attention_benchmark_lists_every_backend() -> None:
    report = run("speed/attention.py", "--window", "4", "--steps", "1", "--skip-model")
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

    command = [
        sys.executable,
        str(BENCHMARKS / "speed" / "throughput.py"),
        "--dataset",
        "builtin",
        "--config-name",
        "quickstart",
    ]
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
    report = run("speed/attention.py", "--steps", "2", "--skip-backends", "--compile", "torch.nn.LayerNorm")
    assert report["backends"] == []
    eager, compiled = report["model"]
    assert eager["compile"] == [] and compiled["compile"] == ["torch.nn.LayerNorm"]
    assert len(compiled["speedup_vs_eager_pairs"]) == 2 and compiled["speedup_vs_eager"] > 0
    assert all(row["cpu_s"] > 0 and row["peak_mib"] > 0 for row in (eager, compiled))


def test_step_time_runs_each_precision() -> None:
    for precision in ("32", "bf16-mixed"):
        report = run("speed/step_time.py", "--steps", "1", "--warmup", "1", "--precision", precision)
        assert report["args"]["precision"] == precision and report["step_cpu_s_median"] > 0


def test_step_time_cuda_graphs_are_refused_where_they_cannot_be_captured() -> None:
    """On CPU, or training without the fused AdamW step a captured step ends with (the GPU kit's -best rows)."""
    for flags, words in (
        (["--cuda-graphs"], "--cuda-graphs needs --device cuda"),
        (["--cuda-graphs", "--device", "cuda", "--precision", "16-mixed"], "not 16-mixed"),
        (["--cuda-graphs", "--device", "cuda"], "--cuda-graphs in training needs --optim adamw"),
    ):
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / "speed" / "step_time.py"), *flags], capture_output=True, text=True
        )
        assert done.returncode == 2 and words in done.stderr.splitlines()[-1], done.stderr


def test_memory_benchmark_reports_each_chunk_count_and_the_ratios() -> None:
    """Flags after the reference size override it (here: the tiny size)."""
    command = [sys.executable, str(BENCHMARKS / "speed" / "memory.py"), "--chunks", "1,4", "--no-inference", *TINY]
    done = subprocess.run([*command, "--steps", "1", "--warmup", "0"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    one, four, summary = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert (one["num_chunks_mapper"], four["num_chunks_mapper"]) == (1, 4)
    assert one["graph"]["data_nodes"] == 12 * 24 and one["live_tensor_peak_mib"] > four["live_tensor_peak_mib"] > 0
    ratio = round(four["peak_step_mib"] / one["peak_step_mib"], 3) if one["peak_step_mib"] > 0 else None
    assert summary["train_peak_ratio_4_over_1"] == ratio  # None when a tiny step does not raise VmHWM


def test_step_time_counts_the_recomputation_flops() -> None:
    """Checkpointing reruns the forward in backward: more matmul FLOPs per step than without it."""
    flags = ["--steps", "1", "--warmup", "0", "--count-flops"]
    checkpointed = run("speed/step_time.py", *flags)["step_gflop"]
    stored = run("speed/step_time.py", *flags, "--no-grad-checkpointing")["step_gflop"]
    assert 1.1 * stored < checkpointed < 1.6 * stored


def test_compare_anchor_tabulates_ratios_against_a_stand_in_anchor() -> None:
    """Our own step_time.py stands in for the anchor harness (same flags, same JSON fields)."""
    script, step_time = BENCHMARKS / "anchor" / "compare_anchor.py", BENCHMARKS / "speed" / "step_time.py"
    stand_in = ["--anchor-python", sys.executable, "--anchor-run", str(step_time)]
    command = [sys.executable, str(script), "--cases", "S", "--rounds", "1", "--steps", "1", *stand_in]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    [case] = json.loads(line)["cases"]
    assert case["case"] == "S" and case["params"]["anchor"] == case["params"]["ours"]
    for figure in ("step_cpu_s", "step_memory_mib"):
        f = case[figure]
        assert f["ratio"] == pytest.approx(f["ours"] / f["anchor"], abs=2e-3)
    assert case["targets"] == {"cpu_time_ratio": 0.7, "memory_ratio": None}
    assert "| S |" in done.stderr


def test_compare_anchor_names_a_missing_anchor(tmp_path) -> None:
    missing = tmp_path / "venv" / "bin" / "python"
    command = [sys.executable, str(BENCHMARKS / "anchor" / "compare_anchor.py"), "--anchor-python", str(missing)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and f"{missing} does not exist" in done.stderr
    done = subprocess.run([*command[:2], "--rounds", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--rounds: expected a positive integer, got 0" in done.stderr


def test_ensemble_skill_reads_verification_files_and_checks_each_target(monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS.parent))
    from benchmarks.skill.ensemble_skill import LEADS, SCORED, mean_rmse_ratios, table, targets

    every_lead = [*LEADS, "6h", "2d"]

    def stage(**scores: float) -> dict:
        by_lead = {v: {lead: dict(scores) for lead in every_lead} for v in SCORED}
        return {"scores": {"leads": every_lead, "scores": by_lead}}

    deterministic = stage(rmse=2.0, mae=1.6)
    good = stage(crps=1.0, ens_rmse=2.0, spread=1.9, ssr=0.95)
    rows = table(deterministic, good)
    assert rows["z_500"]["1d"] == {
        "det_rmse": 2.0, "det_mae": 1.6, "crps": 1.0, "ens_rmse": 2.0, "spread": 1.9, "ssr": 0.95
    }  # fmt: skip
    worst = mean_rmse_ratios(deterministic, good)
    assert worst == dict.fromkeys(SCORED, 1.0) and all(targets(rows, worst, wall_s=60.0).values())
    assert not targets(rows, worst, wall_s=91 * 60.0)["within_90_minutes"]
    bad = stage(crps=1.05, ens_rmse=2.2, spread=1.0, ssr=0.84)
    failing = targets(table(deterministic, bad), mean_rmse_ratios(deterministic, bad), wall_s=60.0)
    assert not any(failing[key] for key in failing if key != "within_90_minutes")
    good["scores"]["scores"]["sp"]["2d"]["ens_rmse"] = 2.01  # one lead outside the table is enough
    assert mean_rmse_ratios(deterministic, good)["sp"] == 1.005


BF16_CASTS_BUDGET = 125
"""Dtype casts (single and multi-tensor) of a bf16-mixed step at host_overhead.py's case S, triton path: 614 before
linear weights were cast once per step in one multi-tensor copy (runtime/weight_casts.py), 112 since."""


def test_host_overhead_counts_ops_per_step_and_per_layer() -> None:
    command = [sys.executable, str(BENCHMARKS / "speed" / "host_overhead.py"), "--cases", "S", "--paths", "triton"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert (report["case"], report["path"], report["syncs_per_step"]) == ("S", "triton", 0)
    assert 0 < 4 * report["ops_per_layer"] < report["ops_per_step"]
    assert report["top_ops"]["aten.detach.default"] > 0
    assert 0 < report["bf16_casts_per_step"] <= BF16_CASTS_BUDGET


def test_gpu_profile_dry_run_summarises_each_run(tmp_path) -> None:
    """On CPU: our run is profiled (host events, no kernels); the anchor's row says its graph is missing."""
    wheels = tmp_path / "wheels"
    command = [sys.executable, str(BENCHMARKS / "gpu" / "gpu_profile.py"), "--out", str(tmp_path), "--device", "cpu"]
    done = subprocess.run(
        [*command, "--cases", "S", "--steps", "1", "--wheels", str(wheels)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours, anchor = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert ours["system"] == "anemo_like" and ours["profile"]["host_aten_events_per_step"] > 1000
    assert ours["profile"]["kernels_per_step"] == 0 and ours["profile"]["gpu_idle_fraction"] is None
    assert anchor["system"] == "anemoi-models" and "no anchor graph" in anchor["skipped"]
    assert "| S | anemo_like |" in (tmp_path / "gpu_profile.md").read_text()

"""Dry runs, at tiny sizes, of the benchmark scripts that drive whole commands: the grid scaling table, every
command on one grid, the tracking overhead, the anchor on points from a file and a big anemoi model imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from anemo_like.data.grids import grid_from_name

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
ANCHOR_PYTHON = Path("/tmp/anchor/venv/bin/python")
ANCHOR_RUN = BENCHMARKS.parents[1] / "shared" / "bench" / "anchor" / "run.py"
needs_anchor = pytest.mark.skipif(
    not (ANCHOR_PYTHON.exists() and ANCHOR_RUN.exists()),
    reason="needs ../shared/bench/anchor and its venv (bash ../shared/bench/anchor/setup.sh)",
)


def test_scaling_dry_run_measures_one_grid_and_redraws_its_report(tmp_path) -> None:
    """benchmarks/scaling/scaling.py on O48 without the anchor and the sharded runs: the model, read and loader-bound
    rows (step_time.py, synthetic_dataset.py and anemo-bench found in their folders), then the report redrawn from
    the saved lines."""
    script = str(BENCHMARKS / "scaling" / "scaling.py")
    rows_file, report = tmp_path / "rows.jsonl", tmp_path / "report"
    flags = ["--grids", "O48", "--no-anchor", "--no-sharded", "--steps", "1", "--warmup", "1", "--out", str(rows_file)]
    done = subprocess.run([sys.executable, script, *flags], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert [(r["row"], r.get("system")) for r in rows] == [("model", "ours"), ("read", None), ("bench", None)]
    assert not [r for r in rows if "stopped" in r], rows
    assert rows[0]["points"] == 10944 and rows[0]["step_cpu_s"] > 0 and rows[2]["bound"] in ("io", "compute", "overlap")
    redraw = [sys.executable, script, "--from", str(rows_file), "--report", str(report)]
    subprocess.run(redraw, capture_output=True, text=True, timeout=300, check=True)
    assert "O48" in (report / "scaling.md").read_text() and (report / "scaling.png").stat().st_size > 0


def test_operational_grid_dry_run_runs_every_command_on_a_small_grid() -> None:
    """benchmarks/scaling/operational_grid.py on O16: the dataset, both trainings, the forecast, the profile and the
    bench all exit 0, each with its wall seconds, memory and the memory plan of the commands that plan."""
    command = [sys.executable, str(BENCHMARKS / "scaling" / "operational_grid.py"), "--grid", "O16", "--mesh-res", "2"]
    done = subprocess.run([*command, "--steps", "1", "--memory-budget-gb", "1"], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    runs = {run["command"]: run for run in report["runs"]}
    assert list(runs) == ["synthetic dataset", "anemo-train", "anemo-train (cached graph)", "anemo-infer 5 days",
                          "anemo-profile", "anemo-bench"]  # fmt: skip
    assert all(run["exit"] == 0 and run["wall_s"] > 0 and run["peak_pss_mib"] > 0 for run in runs.values())
    assert json.loads(runs["synthetic dataset"]["last_line"])["points"] == 1600
    assert runs["anemo-train"]["memory_plan"][0].startswith("memory plan: encoder chunks")


def test_tracking_overhead_dry_run_times_runs_with_and_without_tracking() -> None:
    script = BENCHMARKS / "speed" / "tracking_overhead.py"
    done = subprocess.run([sys.executable, str(script), "--steps", "2", "--pairs", "1"], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["benchmark"] == "tracking_overhead" and report["store"] == "sqlite"
    assert len(report["wall_s_off"]) == len(report["wall_s_on"]) == 1
    assert report["overhead"] == pytest.approx(report["median_wall_s_on"] / report["median_wall_s_off"] - 1, abs=1e-3)


@needs_anchor
def test_anchor_grid_runs_the_anchor_on_points_from_a_file(tmp_path) -> None:
    """benchmarks/anchor/anchor_grid.py in the anchor's venv trains anemoi-models on the O16 points of a file."""
    grid = grid_from_name("O16")
    points = tmp_path / "O16.npz"
    np.savez(points, latitudes=grid.latitudes, longitudes=grid.longitudes)
    sizes = ["--mesh-res", "1", "--channels", "16", "--layers", "2", "--heads", "4", "--steps", "1", "--warmup", "1"]
    command = [str(ANCHOR_PYTHON), str(BENCHMARKS / "anchor" / "anchor_grid.py"), "--points", str(points), *sizes]
    done = subprocess.run([*command, "--grid", "O16", "--threads", "1"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["graph"]["data_nodes"] == grid.latitudes.size == 1600  # the file's points, not the harness's grid
    assert result["args"]["grid_kind"] == "points from O16.npz" and result["loss_finite"]


@needs_anchor
def test_import_big_dry_run_compares_anemoi_and_ours() -> None:
    """benchmarks/anchor/import_big.py at tiny sizes: anemoi-models' predict_step and our import of its checkpoint,
    the same day forecast."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "anchor" / "import_big.py"), "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = done.stdout.strip().splitlines()
    report = json.loads(line)
    assert report["dry_run"] and report["sizes"]["grid_points"] == 16 * 32
    assert report["errors"]["finite"] and report["errors"]["max_rel_error"] < 1e-5
    assert all(report[k][s] > 0 for k in ("peak_mib", "forecast_wall_s") for s in ("anemoi", "ours"))

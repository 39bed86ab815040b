#!/usr/bin/env python3
"""A big anemoi model run leaner than anemoi runs it (issue goal 6): anemoi's default size (1024 channels, 16
processor layers, 16 heads, 100 prognostic variables, multistep 2) on O96 (40,320 points) with a mesh of r5, random
weights, forecast one day (4 steps of 6 h) by anemoi-models and by ``anemo-import`` + ``anemo-infer``.

    python benchmarks/anchor/import_big.py            # the full size (~25 min on 2 cores, 1 thread; ~2 GB in --work)
    python benchmarks/anchor/import_big.py --dry-run  # tiny sizes, the whole pipeline in well under a minute

In one run: the inputs (smooth random fields, their statistics the model's normaliser) and their anemoi-datasets zarr;
the anemoi checkpoint (``anemoi_big_model.py build`` in the anchor venv, written as anemoi-training writes
``inference-*.ckpt``); ``anemo-import`` of it (its own time and peak); anemoi's forecast (``anemoi_big_model.py run``)
and ours (``anemo-infer`` in-process) in fresh processes, each chunk setting of ``--anemoi-chunks`` / ``--ours-chunks``
first over ``--search-steps`` steps (when a side has several), then the chosen one over the day. Prints ONE JSON line:
peaks (VmHWM, MiB), forecast wall and CPU seconds, ratios ours/anemoi, the outputs' relative error, the settings.

Chunk settings ``M,P[,B]``: ``ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER=M`` and ``..._PROCESSOR=P`` (0: unset; anemoi's
mappers use max(4, M)), ``B``: ours' ``memory_budget_gb``. anemoi keeps its fastest setting (the lowest peak within
5 % of it); ours the lowest peak among those at most as slow as anemoi's choice (else its fastest).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import ANCHOR_PYTHON, REPO, cpu_s, last_json, script, status_mib

ANEMOI_SIDE = script("anemoi_big_model.py")
CHUNKS = "ANEMOI_INFERENCE_NUM_CHUNKS"
MAPPERS = ("encoder", "decoder")
FULL = {"grid": "O96", "channels": 1024, "layers": 16, "heads": 16, "mesh_res": 5, "num_vars": 100}
DRY = {"grid": "16x32", "channels": 32, "layers": 2, "heads": 4, "mesh_res": 2, "num_vars": 5}
START = "2020-01-01T00"
INIT = "2020-01-01T06"  # the forecasts' initial date: the second (last) input state
STEPS = 4  # one day of 6-hourly steps
TARGETS = {"peak_ratio": 0.5, "time_ratio": 1.0, "max_rel_error": 1e-5}


def log(message: str) -> None:
    print(f"[import_big {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# inputs: grid, fields, statistics, zarr
# ----------------------------------------------------------------------------------------------------------------
def make_inputs(sizes: dict[str, Any], path: Path, seed: int) -> dict[str, Any]:
    """Smooth random fields (a few low-order waves per variable, drifting in time), their statistics and grid."""
    import numpy as np

    from anemo_like.data.grids import grid_from_name
    from anemo_like.data.zarr_writer import compute_statistics

    grid, rng = grid_from_name(sizes["grid"]), np.random.default_rng(seed)
    names = ["tp"] + [f"var_{i}" for i in range(1, sizes["num_vars"])]  # the anchor's names (ReluBounding on tp)
    dates = np.arange(
        np.datetime64(START, "s"),
        np.datetime64(START, "s") + np.timedelta64(6 * (1 + STEPS), "h") + 1,
        np.timedelta64(6, "h"),
    )
    phi, lam = np.radians(grid.latitudes), np.radians(grid.longitudes)
    waves = 12
    a, b, c = rng.integers(1, 5, waves), rng.integers(0, 5, waves), rng.uniform(0, 2 * np.pi, waves)
    basis = np.cos(a[:, None] * phi + b[:, None] * lam + c[:, None]) * np.cos(phi) ** b[:, None]  # smooth at the poles
    coef = rng.normal(size=(1, len(names), waves)) + 0.1 * np.arange(len(dates))[:, None, None] * rng.normal(
        size=(1, len(names), waves)
    )
    field = np.einsum("tvk,kg->tvg", coef, basis)
    field /= field.std(axis=(0, 2), keepdims=True)
    mean, std = rng.uniform(-50.0, 300.0, len(names)), rng.uniform(1.0, 30.0, len(names))
    values = mean[None, :, None] + std[None, :, None] * field
    values[:, 0] = 1e-3 * np.abs(field[:, 0])  # tp: non-negative
    values = values.astype(np.float32)
    stats = compute_statistics(values[:, :, None, :])  # the zarr's statistics: the model's normaliser too
    arrays = {
        "values": values,
        "names": np.array(names),
        "dates": dates.astype(str),
        "latitudes": grid.latitudes,
        "longitudes": grid.longitudes,
        **{k: stats[k] for k in ("mean", "stdev", "minimum", "maximum")},
    }
    np.savez(path, **arrays)
    return arrays


def write_zarr(arrays: dict[str, Any], path: Path) -> None:
    from anemo_like.data.zarr_writer import write_anemoi_zarr

    write_anemoi_zarr(
        path,
        data=arrays["values"][:, :, None, :],
        variables=[str(n) for n in arrays["names"]],
        dates=arrays["dates"].astype("datetime64[s]"),
        latitudes=arrays["latitudes"],
        longitudes=arrays["longitudes"],
        frequency="6h",
    )


# ----------------------------------------------------------------------------------------------------------------
# processes
# ----------------------------------------------------------------------------------------------------------------
def parse_setting(text: str) -> dict[str, Any]:
    """``M,P[,B]`` -> the chunk variables to set and ours' memory budget."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) not in (2, 3):
        raise argparse.ArgumentTypeError(f"chunk setting {text!r}: expected M,P or M,P,B")
    mapper, processor = int(parts[0]), int(parts[1])
    env = {f"{CHUNKS}_MAPPER": str(mapper)} if mapper else {}
    env |= {f"{CHUNKS}_PROCESSOR": str(processor)} if processor else {}
    budget = float(parts[2]) if len(parts) == 3 and float(parts[2]) > 0 else None
    return {"label": text, "env": env, "memory_budget_gb": budget}


def flags(**values: Any) -> list[str]:
    """``--key value`` pairs (underscores as dashes)."""
    return [item for key, value in values.items() for item in (f"--{key.replace('_', '-')}", str(value))]


def child_env(threads: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(CHUNKS)}
    return env | {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} | extra


def spawn(command: list[str], env: dict[str, str], log_file: Path) -> tuple[dict[str, Any] | str | None, dict]:
    """Run ``command``, its stderr to ``log_file``; (its last JSON line, else its stdout, None when it failed; its
    wall s, CPU s and ru_maxrss from wait4)."""
    start = time.perf_counter()
    with log_file.open("a") as err:
        err.write(f"$ {' '.join(command)}\n")
        err.flush()
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=err, env=env, cwd=REPO, text=True)
        stdout = process.stdout.read()
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    measured = {
        "wall_s": round(time.perf_counter() - start, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_mib": round(usage.ru_maxrss / 1024),
        "returncode": process.returncode,
    }
    if process.returncode != 0:
        tail = log_file.read_text().splitlines()[-15:]
        log(f"FAILED ({process.returncode}): {' '.join(command[:4])} ...; {log_file} ends:\n" + "\n".join(tail))
        return None, measured
    try:
        return last_json(stdout), measured
    except ValueError:  # a command that prints no JSON line (anemo-import): what it said
        return stdout.strip(), measured


def anemoi_run(args, work: Path, setting: dict, steps: int, tag: str) -> dict[str, Any]:
    files = {"checkpoint": work / "inference-last.ckpt", "inputs": work / "inputs.npz"}
    files["out"] = work / f"anemoi-{tag}.npy"
    command = [str(args.anemoi_python), str(ANEMOI_SIDE), "run", *flags(**files, steps=steps, threads=args.threads)]
    result, measured = spawn(command, child_env(args.threads, setting["env"]), work / "anemoi.log")
    return (result or {"failed": measured}) | {"setting": setting["label"], "out": str(work / f"anemoi-{tag}.npy")}


def ours_run(args, work: Path, setting: dict, steps: int, tag: str) -> dict[str, Any]:
    paths = [work / "ours" / "inference.pt", work / "data.zarr", work / f"ours-{tag}.nc"]
    budget = setting["memory_budget_gb"] or 0
    command = [sys.executable, str(Path(__file__).resolve()), "ours-worker", *map(str, paths), str(steps)]
    command += [str(args.threads), str(budget)]
    result, measured = spawn(command, child_env(args.threads, setting["env"]), work / "ours.log")
    return (result or {"failed": measured}) | {"setting": setting["label"], "out": str(work / f"ours-{tag}.nc")}


def ours_worker(argv: list[str]) -> None:
    """A fresh process: ``anemo-infer`` in-process (prepare, then run), timed; the VmHWM of the load and of the run
    (the forecasts reset the kernel's counter, so the process peak is the larger)."""
    checkpoint, dataset, output, steps, threads, budget = argv
    import logging

    import torch

    from anemo_like.config.inference import validate_inference_config
    from anemo_like.distributed.environment import process_group
    from anemo_like.inference.run import prepare, run

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s: %(message)s")
    run_keys = {"dates": [INIT], "lead_time": f"{6 * int(steps)}h", "num_threads": int(threads), "device": "cpu"}
    run_keys |= {"precision": "fp32", "verify": False, "memory_budget_gb": float(budget) or None}
    config = validate_inference_config({"checkpoint": checkpoint, "dataset": dataset, "output": output, **run_keys})
    chunks = {k: v for k, v in os.environ.items() if k.startswith(CHUNKS)}
    imports_mib, t0 = status_mib("VmRSS"), time.perf_counter()
    with process_group(config.device, timeout_minutes=config.collective_timeout_minutes):
        prepared = prepare(config)
        load_peak, loaded_mib = status_mib(), status_mib("VmRSS")
        t1, c1 = time.perf_counter(), cpu_s()
        run(prepared)
    t2, c2 = time.perf_counter(), cpu_s()
    model, hwm = prepared.bundle.model, status_mib()
    mappers = {name: getattr(model, name).eval_num_chunks or getattr(model, name).num_chunks for name in MAPPERS}
    result = {"system": "anemo_like", "chunks": chunks, "memory_budget_gb": config.memory_budget_gb}
    result["effective_chunks"] = {**mappers, "processor": model.processor.eval_num_chunks or 1}
    result |= {"threads": torch.get_num_threads(), "steps": int(steps), "load_wall_s": round(t1 - t0, 2)}
    result |= {"forecast_wall_s": round(t2 - t1, 2), "forecast_cpu_s": round(c2 - c1, 2)}
    result |= {"total_wall_s": round(t2 - t0, 2), "peak_mib": round(max(load_peak, hwm))}
    result |= {"load_peak_mib": round(load_peak), "forecast_peak_mib": round(hwm), "imports_mib": round(imports_mib)}
    result["loaded_mib"] = round(loaded_mib)
    print(json.dumps(result | {"loadavg_1m": round(os.getloadavg()[0], 2)}), flush=True)


def choose(results: list[dict], *, limit_s: float | None) -> dict:
    """anemoi (no limit): the fastest, or the lowest peak within 5 % of it; ours: the lowest peak at most ``limit_s``
    (else the fastest)."""
    ok = [r for r in results if "failed" not in r]
    if not ok:
        raise SystemExit(f"import_big.py: every chunk setting failed: {results}")
    fastest = min(r["forecast_wall_s"] for r in ok)
    within = [r for r in ok if r["forecast_wall_s"] <= (1.05 * fastest if limit_s is None else limit_s)]
    return min(within, key=lambda r: r["peak_mib"]) if within else min(ok, key=lambda r: r["forecast_wall_s"])


def side(runner, args, work, settings, label: str, limit_s: float | None = None) -> tuple[dict, list[dict]]:
    """Search ``settings`` over --search-steps (when several), then the chosen one over the day."""
    search = []
    if len(settings) > 1:
        for i, setting in enumerate(settings):
            search.append(runner(args, work, setting, args.search_steps, f"search{i}"))
            log(f"{label} search {setting['label']}: {json.dumps(search[-1])}")
        chosen = next(s for s in settings if s["label"] == choose(search, limit_s=limit_s)["setting"])
    else:
        chosen = settings[0]
    final = runner(args, work, chosen, STEPS, "day")
    log(f"{label} day {chosen['label']}: {json.dumps(final)}")
    if "failed" in final:
        raise SystemExit(f"import_big.py: {label}'s forecast failed; see {work}/{label}.log")
    return final, search


def errors(arrays: dict[str, Any], anemoi_out: str, ours_out: str) -> dict[str, Any]:
    """Per variable max |ours - anemoi| / max |anemoi| over the day; the worst, and the first step's worst."""
    import numpy as np
    import xarray as xr

    theirs = np.load(anemoi_out).astype(np.float64)  # (steps, grid, variables)
    names = [str(n) for n in arrays["names"]]
    with xr.open_dataset(ours_out) as ds:
        ours = np.stack([ds[n].values.reshape(-1, theirs.shape[1]) for n in names], axis=-1).astype(np.float64)
    diff = np.abs(ours - theirs)
    day = diff.max(axis=(0, 1)) / np.abs(theirs).max(axis=(0, 1))
    first = diff[0].max(axis=0) / np.abs(theirs[0]).max(axis=0)
    in_std = diff.max(axis=(0, 1)) / arrays["stdev"]
    worst = int(np.argmax(day))
    return {
        "max_rel_error": float(day.max()),
        "worst_variable": names[worst],
        "first_step_max_rel_error": float(first.max()),
        "median_rel_error": float(np.median(day)),
        "max_error_in_stdevs": float(in_std.max()),
        "finite": bool(np.isfinite(ours).all()),
    }


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["ours-worker"]:
        return ours_worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes (32 channels, 2 layers, 16x32, r2, 5 vars)")
    parser.add_argument("--work", type=Path, help="folder of the files (default /tmp/import_big; dry run: a temp dir)")
    parser.add_argument("--reuse", action="store_true", help="keep the inputs and checkpoint --work already holds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of both sides")
    parser.add_argument("--anemoi-python", type=Path, default=ANCHOR_PYTHON)
    parser.add_argument("--anemoi-chunks", type=parse_setting, nargs="+", help="M,P settings anemoi tries")
    parser.add_argument("--ours-chunks", type=parse_setting, nargs="+", help="M,P[,B] settings ours tries")
    parser.add_argument("--search-steps", type=int, default=1, help="steps of each setting's trial run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.anemoi_python.exists():
        raise SystemExit(f"import_big.py: {args.anemoi_python} does not exist: bash ../shared/bench/anchor/setup.sh")
    sizes = DRY if args.dry_run else FULL
    default = ["2,2"] if args.dry_run else ["0,0", "16,4", "64,16", "256,64"]
    ours = ["0,0,0.8"] if args.dry_run else ["0,0,1.0", "0,0,1.25", "0,0,1.5"]  # planned by anemo-infer's budget
    args.anemoi_chunks = args.anemoi_chunks or [parse_setting(s) for s in default]
    args.ours_chunks = args.ours_chunks or [parse_setting(s) for s in ours]
    temporary = args.dry_run and args.work is None
    work = Path(tempfile.mkdtemp(prefix="import_big_")) if temporary else (args.work or Path("/tmp/import_big"))
    started = time.perf_counter()
    try:
        report = pipeline(args, sizes, work.resolve())
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    report["run_wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report), flush=True)


def pipeline(args: argparse.Namespace, sizes: dict[str, Any], work: Path) -> dict[str, Any]:
    import numpy as np

    recorded = work / "sizes.json"
    key = json.dumps({**sizes, "seed": args.seed}, sort_keys=True)
    reuse = args.reuse and recorded.exists() and recorded.read_text() == key
    if not reuse:
        shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    if reuse:
        with np.load(work / "inputs.npz") as stored:
            arrays = {k: stored[k] for k in stored.files}
        build = json.loads((work / "build.json").read_text())
        log(f"reusing {work}")
    else:
        log(f"inputs and zarr in {work}")
        arrays = make_inputs(sizes, work / "inputs.npz", args.seed)
        write_zarr(arrays, work / "data.zarr")
        log("building the anemoi checkpoint (anchor venv)")
        paths = {"inputs": work / "inputs.npz", "out": work / "inference-last.ckpt", "dataset": work / "data.zarr"}
        model = {k: sizes[k] for k in ("channels", "layers", "heads", "mesh_res")}
        command = [str(args.anemoi_python), str(ANEMOI_SIDE), "build", *flags(**paths, **model, seed=args.seed)]
        command += flags(threads=args.threads)
        build, measured = spawn(command, child_env(args.threads, {}), work / "build.log")
        if build is None:
            raise SystemExit(f"import_big.py: the anemoi checkpoint build failed; see {work}/build.log")
        build["process"] = measured
        (work / "build.json").write_text(json.dumps(build))
        recorded.write_text(key)
    log(f"checkpoint: {json.dumps(build)}")
    shutil.rmtree(work / "ours", ignore_errors=True)
    checkpoint, output = str(work / "inference-last.ckpt"), str(work / "ours")
    importer = [sys.executable, "-m", "anemo_like.cli.import_anemoi", checkpoint, output]  # anemo-import
    said, measured = spawn(importer, child_env(args.threads, {}), work / "import.log")
    if measured["returncode"] != 0:
        raise SystemExit(f"import_big.py: anemo-import failed; see {work}/import.log")
    log(f"anemo-import: {json.dumps(measured)}: {str(said)[:300]}")
    anemoi, anemoi_search = side(anemoi_run, args, work, args.anemoi_chunks, "anemoi")
    limit = None
    if anemoi_search:  # ours' trials at most as slow as anemoi's choice was in its own trial
        limit = next(r for r in anemoi_search if r["setting"] == anemoi["setting"])["forecast_wall_s"]
    elif len(args.ours_chunks) > 1:
        limit = anemoi["forecast_wall_s"] * args.search_steps / STEPS
    ours, ours_search = side(ours_run, args, work, args.ours_chunks, "ours", limit_s=limit or float("inf"))
    err = errors(arrays, anemoi["out"], ours["out"])

    measures = ("peak_mib", "forecast_wall_s", "forecast_cpu_s", "total_wall_s")
    for result in (anemoi, ours):  # what each run held above its interpreter and imports (its own runtime)
        result["above_imports_mib"] = result["peak_mib"] - result["imports_mib"]
    measures += ("above_imports_mib",)
    ratios = {key: round(ours[key] / anemoi[key], 3) for key in measures}
    brief = lambda r: {k: v for k, v in r.items() if k not in ("system", "threads", "steps", "out")}  # noqa: E731
    graph = {"params": build.get("params"), "graph": build.get("graph")}
    return {
        "benchmark": "import_big",
        "dry_run": args.dry_run,
        "sizes": {**sizes, "grid_points": int(arrays["latitudes"].size), "multistep": 2, "steps": STEPS, **graph},
        "threads": args.threads,
        "precision": "fp32",
        **{key: {"anemoi": anemoi[key], "ours": ours[key]} for key in measures},
        "ratios_ours_over_anemoi": ratios,
        "errors": err,
        "chunks": {"anemoi": brief(anemoi), "ours": brief(ours)},
        "import": {k: measured[k] for k in ("wall_s", "cpu_s", "peak_mib")},
        "targets": {
            "peak_ratio_le_0.5": ratios["peak_mib"] <= TARGETS["peak_ratio"],
            "time_ratio_le_1.0": ratios["forecast_wall_s"] <= TARGETS["time_ratio"],
            "max_rel_error_le_1e-5": err["max_rel_error"] <= TARGETS["max_rel_error"],
        },
        "search": {
            "steps": args.search_steps,
            "anemoi": [brief(r) for r in anemoi_search],
            "ours": [brief(r) for r in ours_search],
        },
        "build": {k: build.get(k) for k in ("file_mib", "graph_s", "model_s", "save_s", "peak_mib", "process")},
    }


if __name__ == "__main__":
    main()

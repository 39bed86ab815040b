#!/usr/bin/env python3
"""Peak step memory and step time per mapper chunk count, and inference memory with the chunking env vars.

Every setting runs in its own process (``benchmarks/speed/step_time.py``), so peaks do not mix. Prints one JSON line
per setting (medians over ``--repeats`` interleaved runs), then one summary line with the ratios the memory
issue targets. The size defaults to the reference one, 1 torch thread (``--grid 96x192 --mesh-res 4 --channels 256
--layers 8 --heads 16 --threads 1``); other flags go to step_time.py after these and override them:

    python benchmarks/speed/memory.py --repeats 3
    python benchmarks/speed/memory.py --repeats 3 --num-chunks-processor 8

Memory is VmHWM above the RSS just before the first step ("peak_rss_steps_delta_mib" of step_time.py); the
live-tensor peak of one extra step (after the timed ones) shows the same without allocator effects, i.e. what a
GPU's allocator would have to hold.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import run_json, script
from benchmarks.speed.step_args import REFERENCE

INFERENCE_SETTINGS = {
    "infer-chunks1": {},
    "infer-env-mapper16": {"ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER": "16"},
    "infer-env-all16": {"ANEMOI_INFERENCE_NUM_CHUNKS": "16"},
}


def run_step_time(flags: list[str], env: dict[str, str]) -> dict:
    """One ``step_time.py`` process with ``env`` over this environment less its chunking variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANEMOI_INFERENCE_NUM_CHUNKS")}
    return run_json([sys.executable, script("step_time.py"), *flags], env={**clean, **env})


def summarise(name: str, runs: list[dict], env: dict[str, str]) -> dict:
    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in runs), 4)

    first = runs[0]
    return {
        "setting": name,
        "mode": first["args"]["mode"],
        "num_chunks_mapper": first["args"]["num_chunks_mapper"],
        "num_chunks_processor": first["args"]["num_chunks_processor"],
        "env": env,
        "peak_step_mib": median("peak_rss_steps_delta_mib"),
        "peak_step_mib_all": [r["peak_rss_steps_delta_mib"] for r in runs],
        "live_tensor_peak_mib": median("live_tensor_peak_mib"),
        "step_s_median": median("step_s_median"),
        "step_cpu_s_median": median("step_cpu_s_median"),
        "rss_before_steps_mib": median("rss_before_steps_mib"),
        "release_cpu_heap_mib": first["args"]["release_cpu_heap_mib"],
        "graph": first["graph"],
        "repeats": len(runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunks", default="1,2,4,8,16", help="mapper chunk counts to train with")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved runs per setting (median reported)")
    parser.add_argument("--no-inference", action="store_true", help="skip the inference settings")
    args, passthrough = parser.parse_known_args()
    base = [*REFERENCE, "--threads", "1", *passthrough]  # step_time.py keeps the last value of a repeated flag
    settings: dict[str, tuple[list[str], dict[str, str]]] = {
        f"train-chunks{c}": ([*base, "--num-chunks-mapper", c, "--live-tensors"], {}) for c in args.chunks.split(",")
    }
    if not args.no_inference:
        for name, env in INFERENCE_SETTINGS.items():
            settings[name] = ([*base, "--mode", "infer", "--num-chunks-mapper", "1", "--live-tensors"], env)

    runs: dict[str, list[dict]] = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, (flags, env) in settings.items():
            runs[name].append(run_step_time(flags, env))
    results = {name: summarise(name, runs[name], settings[name][1]) for name in settings}
    for result in results.values():
        print(json.dumps(result), flush=True)

    summary: dict = {"setting": "summary"}
    one, four = results.get("train-chunks1"), results.get("train-chunks4")
    if one and four:
        summary["train_peak_ratio_4_over_1"] = (
            round(four["peak_step_mib"] / one["peak_step_mib"], 3) if one["peak_step_mib"] > 0 else None
        )
        summary["train_time_ratio_4_over_1"] = round(four["step_cpu_s_median"] / one["step_cpu_s_median"], 3)
        summary["target_peak_ratio_max"] = 0.4
        summary["target_time_ratio_max"] = 1.15
    if not args.no_inference:
        base_peak = results["infer-chunks1"]["peak_step_mib"]
        summary["infer_peak_ratio_mapper16_over_1"] = round(
            results["infer-env-mapper16"]["peak_step_mib"] / base_peak, 3
        )
        summary["infer_peak_ratio_all16_over_1"] = round(results["infer-env-all16"]["peak_step_mib"] / base_peak, 3)
        summary["target_infer_ratio_max"] = 0.5
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()

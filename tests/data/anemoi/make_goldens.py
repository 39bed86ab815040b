"""Regenerate the anemoi golden cases: small real anemoi models trained by anemoi-training, with anemoi-models' own
outputs on fixed inputs, which tests/test_anemoi_import.py compares anemo_like's imports with (no anemoi install
needed there).

Run with the anemoi-training venv of ../shared/bench/anemoi-training (and, for the forcings case, the dataset
that make_forcing_dataset.sh builds), from the repository root:

    bash ../shared/bench/anemoi-training/setup.sh
    bash tests/data/anemoi/make_forcing_dataset.sh
    OMP_NUM_THREADS=1 /tmp/anemoi-training/venv/bin/python tests/data/anemoi/make_goldens.py

Per case it writes tests/data/anemoi/<case>/: ``inference-last.ckpt`` (and ``last.ckpt`` where listed) as
anemoi-training wrote them, and ``golden.npz``: the dataset window the inputs come from (physical values of every
dataset variable the model reads, NaN where the case puts missing values), its dates and grid, anemoi's
``predict_step`` output for the first forward pass, and a 4-step rollout fed back with the dataset's forcings
(fp32, TF32 off, CPU). Training happens under --work (kept, so a rerun only recomputes the outputs).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import torch
import yaml

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[3] / "shared"
BENCH = SHARED / "bench" / "anemoi-training"
HS_T21 = SHARED / "data" / "hs-t21-seed1-1y.zarr"
FORCINGS_ZARR = Path(os.environ.get("FORCINGS_ZARR", "/tmp/anemoi-training/hs-t21-forcings.zarr"))
INIT = np.datetime64("2000-11-05T00:00", "s")  # a validation date
STEPS = 4  # rollout steps of the golden rollout
GRID_FORCINGS = ["cos_latitude", "cos_longitude", "sin_latitude", "sin_longitude"]
DATE_FORCINGS = ["cos_julian_day", "sin_julian_day", "cos_local_time", "sin_local_time", "insolation"]
NORMALIZER = "anemoi.models.preprocessing.normalizer.InputNormalizer"
BOUNDING = "anemoi.models.layers.bounding."

COMMON = {  # every case: a small model, trained long enough for every weight (trainable features too) to move
    "model": {"num_channels": 32},
    "training": {"max_steps": 30, "optimization": {"lr": 3.0e-3, "lr_scheduler": {"warmup_t": 5}}},
}
CASES = {
    "default": {"lightning": True, "dataset": HS_T21, "config": {}},
    "multistep": {  # 3 input steps, 2 output steps per pass, a diagnostic, ReLU floors, std/max/min-max scaling
        "dataset": HS_T21,
        "config": {
            "task": {"multistep_input": 3, "multistep_output": 2},
            "data": {
                "datasets": {
                    "data": {
                        "diagnostic": ["t_250"],
                        "processors": {
                            "normalizer": {
                                "_target_": NORMALIZER,
                                "config": {
                                    "default": "mean-std",
                                    "std": ["u_250"],
                                    "max": ["v_850"],
                                    "min-max": ["t_500"],
                                    "none": GRID_FORCINGS,
                                },
                            }
                        },
                    }
                }
            },
            "model": {
                "bounding": {
                    "datasets": {
                        "data": [
                            {"_target_": BOUNDING + "ReluBounding", "variables": ["t_250"]},
                            {
                                "_target_": BOUNDING + "NormalizedReluBounding",
                                "variables": ["u_850"],
                                "min_val": [-5.0],
                                "normalizer": ["mean-std"],
                            },
                        ]
                    }
                }
            },
        },
    },
    "forcings": {  # computed forcings (insolation normalised by mean-std), imputers before and after the normaliser
        "dataset": FORCINGS_ZARR,
        "missing": {"t_850": (slice(0, 100), "all"), "z_500": (slice(500, 550), "first")},
        "own_data": True,  # the whole data section here (the packaged one would put its normaliser first)
        "config": {
            "data": {
                "format": "zarr",
                "frequency": "6h",
                "datasets": {
                    "data": {
                        "forcing": GRID_FORCINGS + DATE_FORCINGS,
                        "diagnostic": [],
                        "target": None,
                        "processors": {
                            "imputer": {
                                "_target_": "anemoi.models.preprocessing.imputer.InputImputer",
                                "config": {"default": "none", "mean": ["t_850"]},
                            },
                            "normalizer": {
                                "_target_": NORMALIZER,
                                "config": {"default": "mean-std", "none": GRID_FORCINGS + DATE_FORCINGS[:4]},
                            },
                            "constant": {
                                "_target_": "anemoi.models.preprocessing.imputer.ConstantImputer",
                                "config": {"default": "none", 0.5: ["z_500"]},
                            },
                        },
                    }
                },
            },
        },
    },
}


def merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in; a ``processors`` mapping is replaced whole (its order is the order anemoi
    applies them in)."""
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict) and key != "processors":
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def train(case: str, spec: dict, work: Path) -> Path:
    """Train the case with anemoi-training unless its run is already there; returns its checkpoint folder."""
    run = work / case
    found = sorted(run.glob("checkpoint/*/inference-last.ckpt"))
    if found:
        return found[-1].parent
    base = yaml.safe_load((BENCH / "hs_t21_small.yaml").read_text())
    if spec.get("own_data"):
        base["defaults"] = [entry for entry in base["defaults"] if entry != {"data": "zarr"}]
        base.pop("data")
    config = merged(merged(base, COMMON), spec["config"])
    config["hydra"]["run"]["dir"] = str(run / "hydra")
    config["system"]["input"] = {"dataset": str(spec["dataset"]), "graph": str(run / "graph.pt")}
    config["system"]["output"] = {"root": str(run)}
    run.mkdir(parents=True, exist_ok=True)
    (run / f"{case}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    command = [str(Path(sys.executable).parent / "anemoi-training"), "train", f"--config-name={case}"]
    print(f"{case}: training ({' '.join(command)}, in {run})", flush=True)
    subprocess.run(command, cwd=run, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return sorted(run.glob("checkpoint/*/inference-last.ckpt"))[-1].parent


def window(dataset: Path, names: list[str], multistep: int, missing: dict) -> tuple[np.ndarray, ...]:
    """Dates (T,), physical values (T, V, G) of ``names``, latitudes and longitudes (G,): ``multistep`` input states
    up to INIT, then STEPS more; NaN written where ``missing`` says (variable -> (points, "all" input states or the
    "first"))."""
    from anemoi.datasets import open_dataset

    ds = open_dataset(str(dataset))
    dates = np.asarray(ds.dates, dtype="datetime64[s]")
    first = int(np.searchsorted(dates, INIT)) - (multistep - 1)
    rows = list(range(first, first + multistep + STEPS))
    index = [ds.name_to_index[name] for name in names]
    values = np.stack([np.asarray(ds[row])[index, 0, :] for row in rows]).astype(np.float32)
    for name, (points, which) in missing.items():
        states = slice(0, multistep) if which == "all" else slice(0, 1)
        values[states, names.index(name), points] = np.nan
    return dates[rows], values, np.asarray(ds.latitudes), np.asarray(ds.longitudes)


def forecasts(model, indices: dict, values: np.ndarray, multistep: int, steps_out: int) -> np.ndarray:
    """anemoi's predict_step from the first ``multistep`` states, fed back for STEPS steps: (STEPS, G, V_out)."""
    model_in, model_out = indices["model"]["input"], indices["model"]["output"]
    data_in = indices["data"]["input"]["name_to_index"]
    in_names = sorted(model_in["name_to_index"], key=model_in["name_to_index"].get)
    out_names = sorted(model_out["name_to_index"], key=model_out["name_to_index"].get)
    names = sorted(data_in, key=data_in.get)
    x = torch.from_numpy(values[:multistep][:, [names.index(n) for n in in_names]]).transpose(1, 2)[None]
    outputs = []
    while len(outputs) < STEPS:
        y = model.predict_step({"data": x.clone()})["data"][0, :, 0]  # (K, G, V_out)
        for k in range(steps_out):
            state = values[multistep + len(outputs)][[names.index(n) for n in in_names]].T.copy()  # (G, V_in)
            for name in in_names:
                if name in out_names:
                    state[:, in_names.index(name)] = y[k, :, out_names.index(name)].numpy()
            outputs.append(y[k].numpy())
            x = torch.cat([x[:, 1:], torch.from_numpy(state)[None, None]], dim=1)
            if len(outputs) == STEPS:
                break
    return np.stack(outputs)


def golden(case: str, spec: dict, folder: Path, out: Path) -> None:
    """Copy the case's checkpoints into ``out`` and write its golden.npz."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ("inference-last.ckpt", *(["last.ckpt"] if spec.get("lightning") else [])):
        shutil.copyfile(folder / name, out / name)
    model = torch.load(folder / "inference-last.ckpt", weights_only=False, map_location="cpu")  # ours: trusted
    model.eval()
    with zipfile.ZipFile(folder / "inference-last.ckpt") as archive:  # the metadata, as anemoi stored it
        meta = next(n for n in archive.namelist() if n.endswith("anemoi-metadata/anemoi.json"))
        indices = json.loads(archive.read(meta))["data_indices"]["data"]
    data_in = indices["data"]["input"]["name_to_index"]
    names = sorted(data_in, key=data_in.get)
    multistep, steps_out = model.n_step_input, model.n_step_output
    dates, values, latitudes, longitudes = window(spec["dataset"], names, multistep, spec.get("missing", {}))
    with torch.no_grad():
        rollout = forecasts(model, indices, values, multistep, steps_out)
    model_out = indices["model"]["output"]["name_to_index"]
    np.savez_compressed(
        out / "golden.npz",
        dates=dates.astype(str),
        variables=np.array(names),
        values=values,
        outputs=np.array(sorted(model_out, key=model_out.get)),
        rollout=rollout.astype(np.float32),
        multistep=multistep,
        multistep_output=steps_out,
        latitudes=latitudes,
        longitudes=longitudes,
    )
    print(f"{case}: {out} ({len(dates)} dates, {len(names)} variables, rollout {rollout.shape})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--work", type=Path, default=Path("/tmp/anemoi-goldens"))
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for case in args.cases:
        spec = {**CASES[case], "config": merged({}, CASES[case]["config"])}
        golden(case, spec, train(case, spec, args.work), args.out / case)


if __name__ == "__main__":
    main()

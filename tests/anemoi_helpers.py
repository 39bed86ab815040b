"""The anemoi golden cases (tests/data/anemoi/<case>/, made by make_goldens.py with a real anemoi-training): their
checkpoints, the dataset window anemoi's outputs were computed from, and anemo-infer run on our import of them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr
from inference_helpers import infer_config

from anemo_like.anemoi_import.convert import import_checkpoint
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.inference.run import run_inference

GOLDEN = Path(__file__).resolve().parent / "data" / "anemoi"
CASES = ("default", "multistep", "forcings")


def golden(case: str) -> dict[str, np.ndarray]:
    with np.load(GOLDEN / case / "golden.npz") as stored:
        return {key: stored[key] for key in stored.files}


def window_dataset(case: str, path: Path) -> Path:
    """The golden dataset window as an anemoi-datasets zarr (the dates anemoi's inputs and forcings came from)."""
    g = golden(case)
    return write_anemoi_zarr(
        path,
        data=g["values"][:, :, None, :],
        variables=[str(v) for v in g["variables"]],
        dates=g["dates"].astype("datetime64[s]"),
        latitudes=g["latitudes"],
        longitudes=g["longitudes"],
        frequency="6h",
    )


def imported(case: str, folder: Path, kind: str = "inference-last.ckpt") -> Path:
    """Our inference.pt of the case's anemoi checkpoint (``kind``: inference-last.ckpt or last.ckpt)."""
    return import_checkpoint(GOLDEN / case / kind, folder).output


def forecast(case: str, checkpoint: Path, tmp_path: Path, steps: int, *overrides: str) -> xr.Dataset:
    """anemo-infer from the golden initial date over ``steps`` model steps, on the golden window (and any other
    ``overrides``): the forecast."""
    g = golden(case)
    init = g["dates"][int(g["multistep"]) - 1]
    config = infer_config(
        checkpoint,
        f"dataset={window_dataset(case, tmp_path / 'window.zarr')}",
        f"dates=[{str(init)[:16]}]",
        f"lead_time={6 * steps}h",
        f"output={tmp_path / 'forecast.nc'}",
        "verify=false",
        *overrides,
    )
    run_inference(config)
    return xr.open_dataset(tmp_path / "forecast.nc").load()


def relative_errors(case: str, forecast: xr.Dataset, steps: int) -> dict[str, float]:
    """Per output variable: max |ours - anemoi's| / max |anemoi's| over the first ``steps`` steps and the grid
    points anemoi gives a value; a NaN where the other has none counts as infinitely wrong."""
    g = golden(case)
    errors = {}
    for v, name in enumerate(str(n) for n in g["outputs"]):
        theirs = g["rollout"][:steps, :, v].astype(np.float64)
        ours = forecast[name].values.reshape(-1, theirs.shape[-1])[:steps].astype(np.float64)
        if not np.array_equal(np.isnan(theirs), np.isnan(ours)):
            errors[name] = np.inf
            continue
        known = ~np.isnan(theirs)
        errors[name] = float(np.abs(ours[known] - theirs[known]).max() / np.abs(theirs[known]).max())
    return errors

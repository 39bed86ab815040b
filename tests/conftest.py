"""Shared fixtures: a session cache folder holding the built-in dataset, tiny composed run configs, and the
inference checkpoints the anemo-infer tests forecast from (trained once per session)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from inference_helpers import INITIAL_DATES, MIXED_ROLES, SKILL_TRAINING, infer_config
from omegaconf import OmegaConf

from anemo_like.config import RunConfig, config_dir, validate_config
from anemo_like.data.builtin import ensure_builtin_dataset
from anemo_like.graphs import build_graph
from anemo_like.inference.run import InferenceOutputs, run_inference
from anemo_like.training.trainer import Trainer

SHARED_DATASET = Path(__file__).resolve().parents[2] / "shared" / "data" / "hs-t21-seed1-1y.zarr"

TINY_MODEL = [
    "graph.mesh_resolution=1",
    "model.num_channels=16",
    "model.num_heads=2",
    "model.processor.num_layers=1",
    "model.processor.num_chunks=1",
    "dataloader.batch_size.train=2",
    "dataloader.batch_size.val=16",
    "dataloader.limit_batches.val=2",
    "diagnostics.log_every_n_steps=1",
    "diagnostics.progress_bar=false",
]


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """One cache (built-in dataset, graphs) for the whole test session."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session")
def compose_run(cache_dir):
    """compose_run(run_dir, overrides, name="quickstart") -> validated RunConfig writing into run_dir."""

    def compose_run(run_dir: Path, overrides: list[str], name: str = "quickstart") -> RunConfig:
        paths = [f"system.paths.output={run_dir}", f"system.paths.cache={cache_dir}"]
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name=name, overrides=[*TINY_MODEL, *paths, *overrides])
        return validate_config(OmegaConf.to_container(cfg, resolve=True))

    return compose_run


def latlon_graph(nlat: int, nlon: int, mesh_resolution: int):
    """Graph of a cell-centred nlat x nlon lat/lon grid on an icosahedron refined ``mesh_resolution`` times."""
    lats = -90.0 + (np.arange(nlat) + 0.5) * 180.0 / nlat
    lons = np.arange(nlon) * 360.0 / nlon
    lat, lon = (a.ravel() for a in np.meshgrid(lats, lons, indexing="ij"))
    return build_graph(lat, lon, mesh_resolution=mesh_resolution)


@pytest.fixture(scope="session")
def small_graph():
    """A 12x24 lat/lon grid on a once-refined icosahedron."""
    return latlon_graph(12, 24, 1)


# ------------------------------------------------------------------------------ anemo-infer's checkpoints
@pytest.fixture(scope="session")
def builtin(cache_dir) -> Path:
    return ensure_builtin_dataset(cache_dir)


@pytest.fixture(scope="session")
def skilled(tmp_path_factory, compose_run) -> Path:
    """inference.pt of the quickstart model, tiny size, trained 400 steps."""
    run_dir = tmp_path_factory.mktemp("skilled")
    Trainer(compose_run(run_dir, SKILL_TRAINING)).fit()
    return run_dir / "inference.pt"


@pytest.fixture(scope="session")
def mixed(tmp_path_factory, compose_run) -> Path:
    """inference.pt of a 2-step quickstart model with a diagnostic variable (sp) and two computed forcings."""
    run_dir = tmp_path_factory.mktemp("mixed")
    Trainer(compose_run(run_dir, MIXED_ROLES)).fit()
    return run_dir / "inference.pt"


@pytest.fixture(scope="session")
def verified(skilled, tmp_path_factory) -> InferenceOutputs:
    """The 15 verified 5-day forecasts of INITIAL_DATES, as netCDF."""
    out = tmp_path_factory.mktemp("forecast")
    return run_inference(infer_config(skilled, *INITIAL_DATES, f"output={out / 'forecast.nc'}", "verify=true"))

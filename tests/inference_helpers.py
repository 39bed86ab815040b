"""What the anemo-infer tests share: the trained models' recipes, the forecast dates, and helpers that compose an
inference config as the command line does, run the CLI, and check a message against its row in docs/errors.md.
The models themselves are session fixtures in conftest.py (``skilled``, ``mixed``, ``verified``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anemo_like.config import ConfigError
from anemo_like.config.inference import (
    InferenceConfig,
    check_inference_override_keys,
    inference_config_dir,
    validate_inference_config,
)
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.inference.run import prepare

ERRORS_DOC = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
SKILL_TRAINING = [
    "training.max_steps=400",
    "training.val_every_n_steps=400",
    "training.checkpoint_every_n_steps=400",
    "training.optimizer.warmup_steps=10",
    "training.val_climatology_dates=0",
    "dataloader.limit_batches.val=1",
    "diagnostics.plots=false",
]
MIXED_ROLES = [
    "data.variables.prognostic=[t_850,u_250,u_850,v_250,v_850,z_500]",
    "data.variables.diagnostic=[sp]",
    "data.variables.computed_forcing=[cos_julian_day,sin_local_time]",
    "training.max_steps=2",
    "training.val_climatology_dates=0",
    "dataloader.limit_batches.val=1",
    "diagnostics.plots=false",
]
# 15 initial dates, 2000-11-01 .. 2000-12-27 every 4 days; the last forecast runs past the dataset's end (12-30T18)
INITIAL_DATES = ["date_range.start=2000-11-01T00", "date_range.end=2000-12-27T00", "date_range.every=4d"]
INITS = np.datetime64("2000-11-01T00", "s") + np.arange(15) * np.timedelta64(4, "D")
TRAIN_END = np.datetime64("2000-11-01T00", "s")  # the quickstart training split ends just before


def run_infer_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    """``python -m anemo_like.cli.infer ARGS`` in ``tmp_path`` (its Hydra folder ``tmp_path/run``), output captured."""
    command = [sys.executable, "-m", "anemo_like.cli.infer", *args, f"hydra.run.dir={tmp_path / 'run'}"]
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)


def infer_config(checkpoint: Path, *overrides: str) -> InferenceConfig:
    """The default inference config with ``overrides``, checked, composed and validated as on the command line."""
    arguments = [f"checkpoint={checkpoint}", *overrides]
    check_inference_override_keys(arguments)
    with initialize_config_dir(config_dir=str(inference_config_dir()), version_base="1.3"):
        cfg = compose(config_name="default", overrides=arguments)
    return validate_inference_config(OmegaConf.to_container(cfg, resolve=True))


def documented(message: str, **placeholders: Path) -> None:
    """``message``, with each path replaced by its placeholder name, is a row of docs/errors.md, word for word."""
    for name, path in placeholders.items():
        message = message.replace(str(path), name)
    assert f"`{message}`" in ERRORS_DOC, f"not in docs/errors.md:\n{message}"


def setup_error(config: InferenceConfig, error: type[Exception] = ValueError) -> str:
    with pytest.raises(error) as info:
        prepare(config)
    return str(info.value)


def config_error(checkpoint: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        infer_config(checkpoint, *overrides)
    message = str(info.value)
    assert message.startswith("invalid configuration:\n  ")
    return message.removeprefix("invalid configuration:\n  ")


def grid_dataset(path: Path, *, variables: list[str], frequency: str, num_dates: int, lat, lon) -> Path:
    """Random data on the grid (lat, lon), without variables_metadata (no forcing is marked constant)."""
    data = np.random.default_rng(0).normal(size=(num_dates, len(variables), 1, len(lat)))
    step = np.timedelta64(int(frequency.removesuffix("h")), "h")
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(num_dates) * step
    return write_anemoi_zarr(
        path, data=data, variables=variables, dates=dates, latitudes=lat, longitudes=lon, frequency=frequency
    )

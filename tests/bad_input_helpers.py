"""What the bad-input tests share: a tiny anemoi dataset (8 x 16 grid, 20 six-hourly dates) and its config, the
message a config or an action gives, a planted pickle payload, and the CLI run with its one-message checks. The
``dataset`` and ``tiny_run`` fixtures are imported by the test modules that use them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from conftest import TINY_MODEL
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from anemo_like.config import ConfigError, RunConfig, config_dir, validate_config
from anemo_like.config.validate import check_override_keys
from anemo_like.data.zarr_writer import write_anemoi_zarr

FORCINGS = ["cos_latitude", "sin_latitude", "cos_longitude", "sin_longitude"]
VARIABLES = [*FORCINGS, "sp", "t_850", "z_500"]
N_LAT, N_LON, N_DATES = 8, 16, 20  # 20 dates: 2000-01-01T00 .. 2000-01-05T18, 6-hourly
TINY_DATA = [
    "data.variables.prognostic=[sp,t_850,z_500]",
    "data.splits.train.end='2000-01-03T18'",
    "data.splits.val.start='2000-01-04T00'",
    "training.max_steps=2",
    "diagnostics.plots=false",
]


def tiny_grid() -> tuple[np.ndarray, np.ndarray]:
    lat = -90.0 + (np.arange(N_LAT) + 0.5) * 180.0 / N_LAT
    lon = np.arange(N_LON) * 360.0 / N_LON
    lat2, lon2 = np.meshgrid(lat, lon, indexing="ij")
    return lat2.ravel(), lon2.ravel()


def tiny_dataset(path: Path, *, edit: Callable[[np.ndarray], None] | None = None, **kwargs) -> Path:
    """A small anemoi-format dataset of VARIABLES; ``edit`` changes the data array in place before writing."""
    latitudes, longitudes = tiny_grid()
    data = np.random.default_rng(0).normal(size=(N_DATES, len(VARIABLES), 1, N_LAT * N_LON))
    if edit is not None:
        edit(data)
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h")
    arguments = {"latitudes": latitudes, "longitudes": longitudes, "frequency": "6h", **kwargs}
    return write_anemoi_zarr(path, data=data, variables=VARIABLES, dates=dates, **arguments)


def set_values(path: Path, date: int, variable: str, value: float) -> None:
    """Overwrite one date of one variable in an existing dataset (statistics stay as written)."""
    data = zarr.open_group(path, mode="r+")["data"]
    block = data[date]
    block[VARIABLES.index(variable), 0, :5] = value
    data[date] = block


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return tiny_dataset(tmp_path_factory.mktemp("data") / "tiny.zarr")


@pytest.fixture
def tiny_run(tmp_path, compose_run, dataset) -> Callable[..., RunConfig]:
    """tiny_run(*overrides, dataset=path) -> validated config of a tiny model on the tiny dataset."""

    def tiny_run(*overrides: str, dataset: Path = dataset) -> RunConfig:
        return compose_run(tmp_path / "run", [f"data.dataset={dataset}", *TINY_DATA, *overrides])

    return tiny_run


def config_error(*overrides: str) -> str:
    """The message the user sees for these command-line overrides of the quickstart config."""
    try:
        check_override_keys(list(overrides))
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg = compose(config_name="quickstart", overrides=[*overrides, "system.paths.output=/tmp/unused"])
        validate_config(OmegaConf.to_container(cfg, resolve=True))
    except ConfigError as error:
        return str(error)
    raise AssertionError(f"{overrides} was accepted")


def message_of(action: Callable[[], object], error: type[Exception] = ValueError) -> str:
    with pytest.raises(error) as info:
        action()
    return str(info.value)


def assert_message(message: str, pattern: str) -> None:
    """The whole message matches ``pattern`` (a regex); quote literal parts with re.escape."""
    assert re.fullmatch(pattern, message, flags=re.DOTALL), f"\n{message}\n!~\n{pattern}"


class Payload:
    """Unpickling this would run a shell command: what a planted checkpoint would carry."""

    def __reduce__(self) -> tuple:
        return (os.system, ("echo planted payload ran",))


def run_cli(tmp_path: Path, *arguments: str) -> subprocess.Popen:
    """Start ``python -m anemo_like.cli.train`` with the tiny model in ``tmp_path`` (not waiting: several can run
    at once); stdout and stderr are merged."""
    tmp_path.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "anemo_like.cli.train", "--config-name=quickstart", *TINY_MODEL, *arguments]
    return subprocess.Popen(
        [*command, f"system.paths.cache={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'run'}"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def assert_cli_cases(tmp_path: Path, cases: dict[str, tuple[list[str], int, str]], timeout: float = 180) -> None:
    """Run every case (name -> (arguments, exit status, expected text)) at once; each exits with its status and
    prints its text, without a traceback."""
    started = {name: run_cli(tmp_path / name.replace(" ", "-"), *args) for name, (args, _, _) in cases.items()}
    for name, process in started.items():
        output, _ = process.communicate(timeout=timeout)
        _, code, expected = cases[name]
        assert process.returncode == code, f"{name}:\n{output}"
        assert expected in output and "Traceback" not in output, f"{name}:\n{output}"

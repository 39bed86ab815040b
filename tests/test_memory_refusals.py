"""Sizes that cannot fit in memory are refused at set-up (docs/errors.md, "Memory"), by the estimate of
``runtime.size_limits``: ensemble members, batches, the rollout and validation batch of ``anemo-train``; the members,
batch, initial dates and lead time of ``anemo-infer``. Each message is checked word for word, in-process, with a
small ``memory_budget_gb`` so its numbers do not depend on this machine; then the commands run under a 2 GiB address
space (RLIMIT_AS), where a tiny run still works and the refusals come before any large allocation.

The dataset: 400 dates (6-hourly, from 2000-01-01) on a 32 x 64 grid, forcings marked constant (a lead time may
run past its end); training on its first 364 dates, validation on the last 36.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from bad_input_helpers import FORCINGS, VARIABLES, message_of
from conftest import TINY_MODEL
from inference_helpers import documented, infer_config, setup_error

from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.training.setup import build_run
from anemo_like.training.trainer import Trainer

N_LAT, N_LON, N_DATES = 32, 64, 400
DATA = [
    "data.variables.prognostic=[sp,t_850,z_500]",
    "data.splits.train.end='2000-03-31T18'",
    "data.splits.val.start='2000-04-01T00'",
    "training.max_steps=2",
    "dataloader.limit_batches.val=1",
    "training.val_climatology_dates=0",
    "diagnostics.plots=false",
    "system.hardware.accelerator=cpu",
]
ENSEMBLE = ["training.ensemble.members=2", "training.loss.name=afcrps", "model.noise={channels:4}"]
ADDRESS_SPACE = 2 * 2**30  # RLIMIT_AS of the command-line runs: a tiny run needs about 1.6 GiB of it


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    latitudes = -90.0 + (np.arange(N_LAT) + 0.5) * 180.0 / N_LAT
    latitudes, longitudes = np.meshgrid(latitudes, np.arange(N_LON) * 360.0 / N_LON, indexing="ij")
    return write_anemoi_zarr(
        tmp_path_factory.mktemp("data") / "grid.zarr",
        data=np.random.default_rng(0).normal(size=(N_DATES, len(VARIABLES), 1, N_LAT * N_LON)),
        variables=VARIABLES,
        dates=np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h"),
        latitudes=latitudes.ravel(),
        longitudes=longitudes.ravel(),
        frequency="6h",
        attrs={"constant_fields": FORCINGS},
    )


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory, compose_run, dataset) -> Path:
    """inference.pt of a tiny ensemble model, trained 2 steps."""
    run_dir = tmp_path_factory.mktemp("ensemble")
    return Trainer(compose_run(run_dir, [f"data.dataset={dataset}", *DATA, *ENSEMBLE])).fit().inference_checkpoint


# ------------------------------------------------------------------------------------------------ anemo-train
TRAINING_CASES = {
    "ensemble members": (
        [*ENSEMBLE, "training.ensemble.members=500", "system.hardware.memory_budget_gb=0.5"],
        "training.ensemble.members=500 needs about 7.9 GiB (memory model estimate of a validation batch: 16 samples "
        "x 500 members), more than the 0.5 GiB available (system.hardware.memory_budget_gb); the largest that fits is "
        "30: lower training.ensemble.members or set system.hardware.memory_budget_gb to the memory this run may use",
    ),
    "training batch": (
        ["dataloader.batch_size.train=300", "system.hardware.memory_budget_gb=0.5"],
        "dataloader.batch_size.train=300 needs about 0.6 GiB (memory model estimate of a training step: 300 samples, "
        "rollout 1), more than the 0.5 GiB available (system.hardware.memory_budget_gb); the largest that fits is 259: "
        "lower dataloader.batch_size.train or set system.hardware.memory_budget_gb to the memory this run may use",
    ),
    "rollout": (
        ["training.rollout.max=200", "system.hardware.memory_budget_gb=0.5"],
        "training.rollout.max=200 needs about 0.7 GiB (memory model estimate of a training step: 2 samples, rollout "
        "200), more than the 0.5 GiB available (system.hardware.memory_budget_gb); the largest that fits is 139: lower "
        "training.rollout.max or set system.hardware.memory_budget_gb to the memory this run may use",
    ),
    "validation batch": (
        ["dataloader.batch_size.train=1", "dataloader.batch_size.val=36", "system.hardware.memory_budget_gb=0.03"],
        "dataloader.batch_size.val=36 needs about 44 MiB (memory model estimate of a validation batch: 34 samples), "
        "more than the 31 MiB available (system.hardware.memory_budget_gb); the largest that fits is 20: lower "
        "dataloader.batch_size.val or set system.hardware.memory_budget_gb to the memory this run may use",
    ),
}


@pytest.mark.parametrize("case", TRAINING_CASES)
def test_training_sizes_that_cannot_fit_are_refused_at_set_up(case, compose_run, dataset, tmp_path) -> None:
    overrides, expected = TRAINING_CASES[case]
    config = compose_run(tmp_path / "run", [f"data.dataset={dataset}", *DATA, *overrides])
    message = message_of(lambda: build_run(config))
    assert message == expected
    documented(message)


def test_training_sizes_that_fit_are_not_refused(compose_run, dataset, tmp_path) -> None:
    members = ["training.ensemble.members=4", "dataloader.batch_size.train=4", "system.hardware.memory_budget_gb=0.5"]
    build_run(compose_run(tmp_path / "run", [f"data.dataset={dataset}", *DATA, *ENSEMBLE, *members]))


# ------------------------------------------------------------------------------------------------ anemo-infer
ONE_DATE = "dates=[2000-02-01T00]"
INFERENCE_CASES = {
    "members": (
        [ONE_DATE, "lead_time=1d", "members=300000"],
        "members=300000 needs about 27.5 GiB (the forecast of 1 initial date x 300000 members x 4 lead steps held in "
        "memory, and 1 forecast at a time through the model), more than the 0.5 GiB available (memory_budget_gb); the "
        "largest that fits is 5456: lower members or set memory_budget_gb to the memory this run may use",
    ),
    "batch of members": (
        [ONE_DATE, "lead_time=6h", "members=4000", "batch_size=4000"],
        "batch_size=4000 needs about 1.1 GiB (the forecast of 1 initial date x 4000 members x 1 lead step held in "
        "memory, and 4000 forecasts at a time through the model), more than the 0.5 GiB available (memory_budget_gb); "
        "the largest that fits is 1670: lower batch_size or set memory_budget_gb to the memory this run may use",
    ),
    "lead time": (
        [ONE_DATE, "lead_time=100000d"],
        "lead_time=100000d needs about 30.5 GiB (the forecast of 1 initial date x 1 member x 400000 lead steps held in "
        "memory, and 1 forecast at a time through the model), more than the 0.5 GiB available (memory_budget_gb); the "
        "largest that fits is 1637d: shorten lead_time or set memory_budget_gb to the memory this run may use",
    ),
    "initial dates": (
        ["date_range.start=2000-01-01T06", "date_range.end=2000-04-09T18", "date_range.every=6h", "lead_time=20d"],
        "date_range (399 initial dates) needs about 0.7 GiB (the forecast of 399 initial dates x 1 member x 80 lead "
        "steps held in memory, and 1 forecast at a time through the model), more than the 0.5 GiB available "
        "(memory_budget_gb); the largest that fits is 270 initial dates: give fewer initial dates (date_range) or set "
        "memory_budget_gb to the memory this run may use",
    ),
}


@pytest.mark.parametrize("case", INFERENCE_CASES)
def test_forecasts_that_cannot_fit_are_refused_before_they_run(case, ensemble, dataset, tmp_path) -> None:
    overrides, expected = INFERENCE_CASES[case]
    arguments = [f"dataset={dataset}", "device=cpu", "memory_budget_gb=0.5", *overrides]
    message = setup_error(infer_config(ensemble, *arguments, f"output={tmp_path / 'forecast.nc'}"))
    assert message == expected
    documented(message)
    assert not (tmp_path / "forecast.nc").exists()


# ---------------------------------------------------------------------------------- under a 2 GiB address space
def start(module: str, tmp_path: Path, name: str, arguments: list[str]) -> subprocess.Popen:
    """``python -m MODULE ARGUMENTS`` in its own folder under ``tmp_path``, limited to ADDRESS_SPACE of address
    space (not waiting: the cases run at once); stdout and stderr merged."""
    folder = tmp_path / name
    folder.mkdir()
    return subprocess.Popen(
        [sys.executable, "-m", module, *arguments, f"hydra.run.dir={folder / 'hydra'}"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE)),
    )


def assert_outcomes(started: dict[str, subprocess.Popen], expected: dict[str, str | None]) -> None:
    """A case expecting None ran through (status 0); the others exit 2 with one logged line that starts with the
    expected text, no traceback and no allocation failure."""
    for name, process in started.items():
        output, _ = process.communicate(timeout=300)
        if expected[name] is None:
            assert process.returncode == 0, f"{name}:\n{output}"
            continue
        errors = [line for line in output.splitlines() if "[ERROR]" in line]
        assert process.returncode == 2, f"{name}:\n{output}"
        assert len(errors) == 1 and errors[0].split(" - ", 1)[1].startswith(expected[name]), f"{name}:\n{output}"
        for failure in ("Traceback", "MemoryError", "allocate"):
            assert failure not in output, f"{name}:\n{output}"


def test_training_refusals_come_before_any_large_allocation(dataset, cache_dir, tmp_path) -> None:
    common = ["--config-name=quickstart", *TINY_MODEL, f"data.dataset={dataset}", *DATA,
              f"system.paths.cache={cache_dir}", "system.hardware.num_threads=1", "training.max_steps=1"]  # fmt: skip
    cases = {
        "tiny": ([], None),
        "members": ([*ENSEMBLE, "training.ensemble.members=100000"], "training.ensemble.members=100000 needs about "),
        "batch": (["dataloader.batch_size.train=360"], "dataloader.batch_size.train=360 needs about "),
        "budget above the limit": (
            ["system.hardware.memory_budget_gb=64"],
            "system.hardware.memory_budget_gb=64 is more than this process may still use (",
        ),
        "budget below everything": (
            ["system.hardware.memory_budget_gb=1e-6"],
            "the 1 KiB available (system.hardware.memory_budget_gb) is less than even the smallest run needs (about ",
        ),
    }
    started = {
        name: start(
            "anemo_like.cli.train",
            tmp_path,
            name,
            [*common, f"system.paths.output={tmp_path / name / 'run'}", *arguments],
        )
        for name, (arguments, _) in cases.items()
    }
    assert_outcomes(started, {name: text for name, (_, text) in cases.items()})


def test_inference_refusals_come_before_any_large_allocation(ensemble, dataset, tmp_path) -> None:
    common = [f"checkpoint={ensemble}", f"dataset={dataset}", "dates=[2000-02-01T00]", "lead_time=1d", "device=cpu",
              "num_threads=1"]  # fmt: skip
    cases = {
        "tiny": (["members=2"], None),
        "members": (["members=300000"], "members=300000 needs about "),
        "batch": (["members=10000", "batch_size=10000", "lead_time=6h"], "batch_size=10000 needs about "),
        "budget above the limit": (["memory_budget_gb=64"], "memory_budget_gb=64 is more than this process may still "),
        "budget below everything": (["memory_budget_gb=1e-6"], "the 1 KiB available (memory_budget_gb) is less than "),
    }
    started = {
        name: start("anemo_like.cli.infer", tmp_path, name, [*common, f"output={tmp_path / name / 'f.nc'}", *arguments])
        for name, (arguments, _) in cases.items()
    }
    assert_outcomes(started, {name: text for name, (_, text) in cases.items()})

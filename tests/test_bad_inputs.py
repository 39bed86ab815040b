"""Catalogue of bad inputs (docs/errors.md): each fails with one message naming the file, key or value and what
was expected, never an internal traceback. Config cases go through the same path as the command line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from conftest import TINY_MODEL
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch._utils import ExceptionWrapper

from anemo_like.checkpoints.training import load_training_checkpoint
from anemo_like.config import ConfigError, RunConfig, config_dir, validate_config
from anemo_like.config.schema import ModelConfig
from anemo_like.config.validate import check_override_keys
from anemo_like.data.setup import setup_data
from anemo_like.data.window_dataset import NonFiniteDataError
from anemo_like.data.zarr_store import write_anemoi_zarr
from anemo_like.distributed.environment import launch_rank, select_device
from anemo_like.graphs.cache import graph_cache_key, load_or_build_graph
from anemo_like.runtime.inference_environment import (
    check_inference_environment,
    inference_num_chunks,
    with_graph_backend_from_environment,
)
from anemo_like.training.loss import WeightedMSE
from anemo_like.training.trainer import Trainer

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


# --------------------------------------------------------------------------------------------------- helpers
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


# ---------------------------------------------------------------------------------------------------- config
CONFIG_CASES = {
    "misspelled key on the command line": (
        ["model.num_chanels=3"],
        r"invalid configuration:\n  unknown config key 'model\.num_chanels' \(did you mean 'model\.num_channels'\?\); "
        r"allowed here: num_channels, num_heads, .*",
    ),
    "misspelled nested key": (
        ["model.procesor.num_layers=2"],
        r"invalid configuration:\n  unknown config key 'model\.procesor\.num_layers' "
        r"\(did you mean 'model\.processor'\?\); allowed here: .*",
    ),
    "wrong type": (
        ["model.num_channels=wide"],
        r"invalid configuration:\n  config key 'model\.num_channels' = 'wide': Input should be a valid integer, "
        r"unable to parse string as an integer",
    ),
    "impossible value": (
        ["model.num_heads=0"],
        r"invalid configuration:\n  config key 'model\.num_heads' = 0: Input should be greater than or equal to 1",
    ),
    "prefetch_factor without workers": (
        ["dataloader.prefetch_factor=4"],
        r"invalid configuration:\n  config section 'dataloader': dataloader\.prefetch_factor=4 needs worker processes, "
        r"but dataloader\.num_workers\.train and \.val are both 0: raise dataloader\.num_workers\.train \(and \.val\) "
        r"or set dataloader\.prefetch_factor=null",
    ),
    "persistent_workers without workers": (
        ["dataloader.persistent_workers=true"],
        r"invalid configuration:\n  config section 'dataloader': dataloader\.persistent_workers=true needs worker "
        r"processes, .*",
    ),
    "unknown precision": (
        ["training.precision=16"],
        r"invalid configuration:\n  config key 'training\.precision' = 16: Input should be '32', 'tf32', "
        r"'bf16-mixed', '16-mixed' or 'bf16'",
    ),
    "heads do not divide channels": (
        ["model.num_channels=30", "model.num_heads=4"],
        r"invalid configuration:\n  config section 'model': num_channels \(30\) must be divisible by num_heads \(4\)",
    ),
    "mapper num_chunks not a power of two": (
        ["model.encoder.num_chunks=3"],
        r"invalid configuration:\n  config key 'model\.encoder\.num_chunks' = 3: "
        r"must be a power of two \(1, 2, 4, \.\.\.\) or 'auto', got 3",
    ),
    "processor num_chunks above num_layers": (
        ["model.processor.num_layers=2", "model.processor.num_chunks=3"],
        r"invalid configuration:\n  config section 'model\.processor': "
        r"num_chunks \(3\) must be between 1 and num_layers \(2\)",
    ),
    "rollout start above max": (
        ["training.rollout.start=3"],
        r"invalid configuration:\n  config section 'training\.rollout': start \(3\) must be at most max \(1\)",
    ),
    "variable in two roles": (
        ["data.variables.forcing=[z_500]"],
        r"invalid configuration:\n  config section 'data\.variables': "
        r"variable 'z_500' is listed as both prognostic and forcing",
    ),
    "unknown computed forcing": (
        ["data.variables.computed_forcing=[cos_julian_days]"],
        r"invalid configuration:\n  config key 'data\.variables\.computed_forcing\.0' = 'cos_julian_days': "
        r"Input should be 'cos_julian_day', 'sin_julian_day', 'cos_local_time' or 'sin_local_time'",
    ),
    "timestep not a duration": (
        ["data.timestep=6hours"],
        r"invalid configuration:\n  config key 'data\.timestep' = '6hours': "
        r"expected a whole number and a unit m, h or d, e\.g\. '30m', '6h', '1d'",
    ),
    "unknown nan policy": (
        ["data.nan_policy=skip"],
        r"invalid configuration:\n  config key 'data\.nan_policy' = 'skip': Input should be 'error' or 'mask'",
    ),
    "required key left unset": (
        ["data.dataset=???"],
        r"invalid configuration:\n  missing config key 'data\.dataset': "
        r"set it in the config or on the command line \(data\.dataset=\.\.\.\)",
    ),
    "relu_bounded names an input-only variable": (
        ["model.relu_bounded=[cos_latitude]"],
        r"invalid configuration:\n  model\.relu_bounded names \['cos_latitude'\], which are not output variables",
    ),
}


@pytest.mark.parametrize("overrides, pattern", CONFIG_CASES.values(), ids=CONFIG_CASES)
def test_config(overrides: list[str], pattern: str) -> None:
    assert_message(config_error(*overrides), pattern)


# ------------------------------------------------------------------------------------------------------ data
def test_missing_dataset_path(tiny_run, tmp_path) -> None:
    missing = tmp_path / "nowhere.zarr"
    message = message_of(lambda: setup_data(tiny_run(dataset=missing)), FileNotFoundError)
    assert message == f"{missing}: no such dataset (expected an anemoi-datasets zarr directory)"


def test_dataset_path_is_a_file(tiny_run, tmp_path) -> None:
    path = tmp_path / "data.nc"
    path.write_bytes(b"CDF\x01")
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == f"{path}: is a file, not a dataset (expected an anemoi-datasets zarr directory)"


def test_dataset_path_is_not_a_zarr(tiny_run, tmp_path) -> None:
    path = tmp_path / "folder.zarr"
    path.mkdir()
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == (
        f"{path}: not a zarr group (no .zgroup or zarr.json inside; expected an anemoi-datasets zarr directory)"
    )


def test_zarr_that_is_not_an_anemoi_dataset(tiny_run, tmp_path) -> None:
    path = tmp_path / "plain.zarr"
    zarr.open_group(path, mode="w").create_array("x", data=np.zeros(3))
    assert message_of(lambda: setup_data(tiny_run(dataset=path))) == f"{path}: 'variables' group attribute is missing"


def test_dataset_without_data_array(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr")
    shutil.rmtree(path / "data")
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == f"{path}: 'data' array is missing; expected (dates, variables, ensembles, grid) float32"


def test_dataset_without_statistics(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr")
    shutil.rmtree(path / "stdev")
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == f"{path}: 'stdev' array is missing; expected shape (7,)"


def test_dataset_with_unparseable_frequency(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr")
    zarr.open_group(path, mode="r+").attrs["frequency"] = "six hours"
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == (
        f"{path}: 'frequency': cannot parse frequency 'six hours'; expected e.g. '6h', '30m', '1d' or int hours"
    )


def test_dataset_with_a_gap_in_its_dates(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr")
    dates = zarr.open_group(path, mode="r+")["dates"]
    shifted = dates[...]
    shifted[10:] += np.timedelta64(6, "h")
    dates[...] = shifted
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == (
        f"{path}: 'dates' must increase by the frequency 6h without gaps; "
        "found 2000-01-03T06:00:00 followed by 2000-01-03T18:00:00"
    )


def test_dataset_with_latitudes_out_of_range(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr", latitudes=tiny_grid()[0] * 2)
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == f"{path}: 'latitudes' reach 157.5; expected degrees within [-90, 90]"


def test_variable_not_in_the_dataset(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("data.variables.prognostic=[sp,t_860]")))
    assert message == (
        f"{dataset}: unknown variable(s) 't_860' (did you mean 't_850'?); available: {', '.join(VARIABLES)}"
    )


def test_normalizer_names_an_unselected_variable(tiny_run) -> None:
    message = message_of(lambda: setup_data(tiny_run("+data.normalizer.per_variable.q_700=none")))
    assert message == "data.normalizer.per_variable names ['q_700'], which are not selected variables"


def test_timestep_not_a_multiple_of_the_data_frequency(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("data.timestep=9h")))
    assert message == f"data.timestep '9h' must be a multiple of the frequency of {dataset} (6h)"


@pytest.mark.parametrize(
    "override, pattern",
    [
        (
            "data.splits.val.end='2000-02-01'",
            r"data\.splits\.val: {path}: date window 2000-01-04T00 \.\. 2000-02-01 is outside the dataset, "
            r"which covers 2000-01-01T00:00:00 \.\. 2000-01-05T18:00:00",
        ),
        (
            "data.splits.train.end=yesterday",
            r"data\.splits\.train: {path}: cannot parse date 'yesterday'; expected ISO 8601 like 2000-01-31T18",
        ),
        (
            "data.splits.train.start='2000-01-04'",
            r"data\.splits\.train: {path}: date window 2000-01-04 \.\. 2000-01-03T18 contains no dates "
            r"\(start is after end\)",
        ),
    ],
    ids=["dates outside the dataset", "unparseable date", "start after end"],
)
def test_bad_split_dates(tiny_run, dataset, override: str, pattern: str) -> None:
    message = message_of(lambda: setup_data(tiny_run(override)))
    assert_message(message, pattern.format(path=re.escape(str(dataset))))


def test_validation_split_too_short(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("data.splits.val.start='2000-01-05T12'")))
    assert message == (
        f"data.splits.val (2000-01-05T12 .. None) of {dataset} holds 2 dates, too few for 3 states 6h apart "
        "(training.multistep_input 2 + training.val_rollout 1); widen the split or shorten the rollout"
    )


def test_rollout_longer_than_the_training_window(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("training.rollout.max=11")))
    assert message == (
        f"data.splits.train (None .. 2000-01-03T18) of {dataset} holds 12 dates, too few for 13 states 6h apart "
        "(training.multistep_input 2 + training.rollout.max 11); widen the split or shorten the rollout"
    )


def test_statistics_with_zero_stdev(tiny_run, tmp_path) -> None:
    def constant_t850(data: np.ndarray) -> None:
        data[:, VARIABLES.index("t_850")] = 250.0

    path = tiny_dataset(tmp_path / "d.zarr", edit=constant_t850)
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert message == (
        f"{path}: variable 't_850' has unusable statistics for 'mean-std' normalisation (offset 250.0, scale 0.0); "
        "fix the statistics or leave it unnormalised (data.normalizer.per_variable.t_850: none)"
    )


def test_statistics_with_nan_stdev(tiny_run, tmp_path) -> None:
    path = tiny_dataset(tmp_path / "d.zarr")
    stdev = zarr.open_group(path, mode="r+")["stdev"]
    values = stdev[...]
    values[VARIABLES.index("sp")] = np.nan
    stdev[...] = values
    message = message_of(lambda: setup_data(tiny_run(dataset=path)))
    assert_message(
        message,
        re.escape(f"{path}: variable 'sp' has unusable statistics for 'mean-std' normalisation (offset ")
        + r"-?[\d.e-]+, scale nan\); "
        + re.escape("fix the statistics or leave it unnormalised (data.normalizer.per_variable.sp: none)"),
    )


# ------------------------------------------------------------------------------------------ NaN / inf in data
@pytest.fixture(scope="module")
def gappy_dataset(tmp_path_factory) -> Path:
    """The tiny dataset with NaN in sp at date 1 and inf in z_500 at date 2 (both in the training split)."""
    path = tiny_dataset(tmp_path_factory.mktemp("gappy") / "gappy.zarr")
    set_values(path, 1, "sp", np.nan)
    set_values(path, 2, "z_500", np.inf)
    return path


def test_nan_and_inf_in_a_sample_name_dataset_dates_and_variables(tiny_run, gappy_dataset) -> None:
    train = setup_data(tiny_run(dataset=gappy_dataset)).train
    message = message_of(lambda: train[0], NonFiniteDataError)
    assert message == (
        f"{gappy_dataset}: NaN or inf values at 2000-01-01T06:00:00 in sp (5 of 128 points); "
        "2000-01-01T12:00:00 in z_500 (5 of 128 points); "
        "fix the dataset, or set data.nan_policy=mask to leave them out of the loss"
    )


def test_nan_error_from_a_loader_worker_carries_no_traceback(tiny_run, gappy_dataset) -> None:
    train = setup_data(tiny_run(dataset=gappy_dataset)).train
    try:
        train[0]
    except NonFiniteDataError:  # what a DataLoader worker sends back: the error's type and formatted traceback
        from_worker = ExceptionWrapper(where="in DataLoader worker process 0")
    message = message_of(from_worker.reraise, NonFiniteDataError)  # as the DataLoader re-raises it
    assert message.startswith(f"{gappy_dataset}: NaN or inf values at 2000-01-01T06:00:00 in sp") and (
        "Traceback" not in message
    )


def test_nan_policy_mask_zeroes_inputs_and_masks_targets(tiny_run, gappy_dataset) -> None:
    data = setup_data(tiny_run("data.nan_policy=mask", dataset=gappy_dataset))
    sample = data.train[0]  # dates 0, 1 (inputs), 2 (target); variables sp, t_850, z_500, forcings
    assert sample.isfinite().sum() == sample.numel() - 5, "only the target's inf stays (as NaN)"
    sp, z_500 = data.roles.sample.index("sp"), data.roles.sample.index("z_500")
    assert (sample[1, :5, sp] == 0).all(), "an input NaN is fed to the model as 0 (the mean)"
    assert sample[2, :5, z_500].isnan().all(), "a target inf stays missing for the loss"
    area = torch.ones(N_LAT * N_LON)
    loss = WeightedMSE(area_weight=area, variable_weight=torch.ones(3))
    target = sample[2, :, :3].unsqueeze(0)
    prediction = torch.zeros_like(target, requires_grad=True)
    value = loss(prediction, target)
    value.backward()
    per_variable = [values[values.isfinite()].square().mean() for values in target[0].T]
    assert value.item() == pytest.approx(torch.stack(per_variable).mean().item(), rel=1e-5)
    assert prediction.grad.isfinite().all() and (prediction.grad[0, :5, 2] == 0).all()


def test_nan_policy_mask_trains(tiny_run, gappy_dataset) -> None:
    outputs = Trainer(tiny_run("data.nan_policy=mask", "training.max_steps=3", dataset=gappy_dataset)).fit()
    assert np.isfinite(outputs.validation.loss)
    records = [json.loads(line) for line in outputs.metrics.read_text().splitlines()]
    losses = [record["train_loss"] for record in records if "train_loss" in record]
    assert losses and np.isfinite(losses).all()
    assert np.isfinite(outputs.validation.model_rmse).all()  # scored over the points that have a target
    assert np.isfinite(outputs.validation.persistence_rmse).all()


# ----------------------------------------------------------------------------------------------------- graph
def test_cached_graph_of_another_grid(tmp_path) -> None:
    latitudes, longitudes = tiny_grid()
    load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=0)
    other = latitudes[: N_LON * 4], longitudes[: N_LON * 4]
    (built,) = tmp_path.glob("graph-*.pt")
    planted = (
        tmp_path
        / f"graph-{graph_cache_key(*other, mesh_resolution=0, cutoff_factor=0.6, knn=3, processor_edges=True)}.pt"
    )
    built.rename(planted)
    message = message_of(lambda: load_or_build_graph(*other, cache_dir=tmp_path, mesh_resolution=0))
    assert message == (
        f"{planted}: graph cache file was built for another grid (128 points; the dataset has 64, "
        "or the coordinates differ); delete it and it will be rebuilt"
    )


def test_corrupted_graph_cache_file(tmp_path) -> None:
    latitudes, longitudes = tiny_grid()
    load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=0)
    (path,) = tmp_path.glob("graph-*.pt")
    path.write_bytes(path.read_bytes()[:1000])
    message = message_of(lambda: load_or_build_graph(latitudes, longitudes, cache_dir=tmp_path, mesh_resolution=0))
    assert message == (
        f"{path} is not a valid graph cache file: not a complete torch.save archive (truncated, corrupted or another "
        "kind of file); delete it and it will be rebuilt"
    )


# ------------------------------------------------------------------------------------------------ checkpoint
class Payload:
    """Unpickling this would run a shell command: what a planted checkpoint would carry."""

    def __reduce__(self) -> tuple:
        return (os.system, ("echo planted payload ran",))


def test_resume_from_a_missing_file(tmp_path) -> None:
    path = tmp_path / "last.pt"
    message = message_of(lambda: load_training_checkpoint(path), FileNotFoundError)
    assert message == f"training checkpoint {path} does not exist (training.resume)"


def test_resume_from_a_truncated_checkpoint(tmp_path) -> None:
    path = tmp_path / "last.pt"
    torch.save({"format": "anemo_like-training-v1", "model": {"w": torch.zeros(1000)}}, path)
    path.write_bytes(path.read_bytes()[:-200])
    assert message_of(lambda: load_training_checkpoint(path)) == (
        f"{path} is not a valid training checkpoint (training.resume): not a complete torch.save archive "
        "(truncated, corrupted or another kind of file)"
    )


def test_resume_from_a_checkpoint_with_corrupted_contents(tmp_path) -> None:
    path = tmp_path / "last.pt"
    torch.save({"format": "anemo_like-training-v1", "step": 3}, path)
    data = bytearray(path.read_bytes())
    start = data.index(b"\x80\x02")  # the pickled dict inside the zip archive
    data[start + 2 : start + 8] = b"xxxxxx"  # flipped bytes the zip layer does not notice
    path.write_bytes(data)
    assert message_of(lambda: load_training_checkpoint(path)) == (
        f"{path} is not a valid training checkpoint (training.resume): its contents are corrupted or not plain "
        "tensors (weights_only load refused)"
    )


def test_resume_from_a_file_of_another_format(tmp_path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model: {num_channels: 16}\n")
    assert message_of(lambda: load_training_checkpoint(path)) == (
        f"{path} is not a valid training checkpoint (training.resume): not a complete torch.save archive "
        "(truncated, corrupted or another kind of file)"
    )


def test_resume_from_another_kind_of_torch_file(tmp_path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(3)}, path)
    assert message_of(lambda: load_training_checkpoint(path)) == (
        f"{path} is not an anemo_like training checkpoint (expected format anemo_like-training-v1)"
    )


def test_resume_refuses_a_planted_pickle_payload(tmp_path, capfd) -> None:
    path = tmp_path / "last.pt"
    torch.save({"format": "anemo_like-training-v1", "step": Payload()}, path)
    assert message_of(lambda: load_training_checkpoint(path)) == (
        f"{path} is not a safe training checkpoint (training.resume): it holds pickled Python code (posix.system), "
        "which torch.load(weights_only=True) refuses to run; do not use files from untrusted sources"
    )
    assert "planted payload ran" not in capfd.readouterr().out


# ----------------------------------------------------------------------------------------------- environment
@pytest.mark.parametrize(
    "variable, value, call, expected",
    [
        (
            "ANEMOI_INFERENCE_NUM_CHUNKS",
            "abc",
            lambda: inference_num_chunks("MAPPER"),
            "environment variable ANEMOI_INFERENCE_NUM_CHUNKS='abc': expected a positive integer",
        ),
        ("RANK", "two", launch_rank, "environment variable RANK='two' is not an integer rank"),
        (
            "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND",
            "flash",
            check_inference_environment,
            "environment variable ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND='flash': expected one of "
            "flash_attention, scaled_dot_product_attention, reference",
        ),
        (
            "ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND",
            "pyg",
            lambda: with_graph_backend_from_environment(ModelConfig()),
            "environment variable ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND='pyg': expected one of "
            "torch, reference, triton",
        ),
    ],
    ids=["ANEMOI_INFERENCE_NUM_CHUNKS=abc", "RANK=two", "TRANSFORMER_ATTENTION_BACKEND", "GRAPH_ATTENTION_BACKEND"],
)
def test_bad_environment_variable(monkeypatch, variable: str, value: str, call, expected: str) -> None:
    monkeypatch.setenv(variable, value)
    assert message_of(call) == expected


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("ANEMOI_INFERENCE_NUM_CHUNKS", "abc", "ANEMOI_INFERENCE_NUM_CHUNKS='abc': expected a positive integer"),
        ("RANK", "two", "RANK='two' is not an integer rank"),
        (
            "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND",
            "flash",
            "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND='flash': expected one of",
        ),
    ],
)
def test_bad_environment_variable_fails_at_setup(compose_run, tmp_path, monkeypatch, variable, value, expected):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError, match=re.escape(f"environment variable {expected}")):
        Trainer(compose_run(tmp_path, []))


def test_cache_folder_that_cannot_be_written(monkeypatch, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("ANEMO_LIKE_CACHE", str(blocker / "cache"))
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="quickstart", overrides=[*TINY_MODEL, f"system.paths.output={tmp_path}"])
    config = validate_config(OmegaConf.to_container(cfg, resolve=True))
    assert message_of(lambda: setup_data(config)) == (
        f"system.paths.cache {blocker / 'cache'} (default: $ANEMO_LIKE_CACHE) is not a writable folder "
        "(Not a directory); point ANEMO_LIKE_CACHE or system.paths.cache at a folder you can write"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_accelerator_without_cuda() -> None:
    assert message_of(lambda: select_device("cuda")) == (
        "system.hardware.accelerator is 'cuda' but torch sees no CUDA device; use 'cpu' or 'auto'"
    )


# ------------------------------------------------------------------------------------------------------- CLI
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


def test_cli_shows_one_message_and_no_traceback(tmp_path, dataset, gappy_dataset) -> None:
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(b"PK\x03\x04 cut short")
    cases = {
        "misspelled key": (["model.num_chanels=3"], 2, "did you mean 'model.num_channels'?"),
        "missing dataset": (
            [f"data.dataset={tmp_path / 'nowhere.zarr'}"],
            2,
            f"{tmp_path / 'nowhere.zarr'}: no such dataset",
        ),
        "truncated checkpoint": (
            [f"data.dataset={dataset}", *TINY_DATA, f"training.resume={truncated}"],
            2,
            f"{truncated} is not a valid training checkpoint (training.resume)",
        ),
        "model sharding without the ranks": (
            ["system.hardware.num_gpus_per_model=2"],
            2,
            "system.hardware.num_gpus_per_model=2 does not divide the world size (1 ranks)",
        ),
        "CUDA graphs on a CPU": (
            [f"data.dataset={dataset}", *TINY_DATA, "training.cuda_graphs=true"],
            2,
            "training.cuda_graphs=true: it needs a CUDA device and this run is on cpu; set training.cuda_graphs=false",
        ),
        "NaN in the data": (
            [f"data.dataset={gappy_dataset}", *TINY_DATA],
            1,
            f"anemo-train failed: NonFiniteDataError: {gappy_dataset}: NaN or inf values at ",
        ),
    }
    assert_cli_cases(tmp_path, cases)


def assert_cli_cases(tmp_path: Path, cases: dict[str, tuple[list[str], int, str]], timeout: float = 180) -> None:
    """Run every case (name -> (arguments, exit status, expected text)) at once; each exits with its status and
    prints its text, without a traceback."""
    started = {name: run_cli(tmp_path / name.replace(" ", "-"), *args) for name, (args, _, _) in cases.items()}
    for name, process in started.items():
        output, _ = process.communicate(timeout=timeout)
        _, code, expected = cases[name]
        assert process.returncode == code, f"{name}:\n{output}"
        assert expected in output and "Traceback" not in output, f"{name}:\n{output}"


def test_cli_debug_shows_the_traceback(tmp_path) -> None:
    process = run_cli(tmp_path, "--debug", f"data.dataset={tmp_path / 'nowhere.zarr'}")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "Traceback (most recent call last)" in output and "FileNotFoundError" in output


def test_errors_doc_catalogues_at_least_25_cases() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| bad input")]
    assert len(rows) >= 25

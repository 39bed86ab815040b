"""Catalogue of bad inputs (docs/errors.md): each fails with one message naming the file, key or value and what
was expected, never an internal traceback. Config cases go through the same path as the command line."""

from __future__ import annotations

import re
import shutil

import bad_input_helpers
import numpy as np
import pytest
import zarr
from bad_input_helpers import (
    VARIABLES,
    assert_message,
    config_error,
    message_of,
    tiny_dataset,
    tiny_grid,
)
from inference_helpers import documented

from anemo_like.config.schema import ModelConfig
from anemo_like.data.setup import setup_data

dataset, tiny_run = bad_input_helpers.dataset, bad_input_helpers.tiny_run  # the shared fixtures


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
        r"invalid configuration:\n  config key 'model\.num_channels' = 'wide': expected a whole number",
    ),
    "impossible value": (
        ["model.num_heads=0"],
        r"invalid configuration:\n  config key 'model\.num_heads' = 0: expected at least 1",
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
        r"invalid configuration:\n  config key 'training\.precision' = 16: expected '32', 'tf32', "
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
        r"expected 'cos_julian_day', 'sin_julian_day', 'cos_local_time', 'sin_local_time', 'cos_latitude', "
        r"'sin_latitude', 'cos_longitude', 'sin_longitude', 'insolation' or 'cos_solar_zenith_angle'",
    ),
    "timestep not a duration": (
        ["data.timestep=6hours"],
        r"invalid configuration:\n  config key 'data\.timestep' = '6hours': "
        r"expected a whole number and a unit m, h or d, e\.g\. '30m', '6h', '1d'",
    ),
    "unknown nan policy": (
        ["data.nan_policy=skip"],
        r"invalid configuration:\n  config key 'data\.nan_policy' = 'skip': expected 'error' or 'mask'",
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


def test_a_misspelled_key_lists_every_key_of_its_section_as_documented() -> None:
    message = config_error("model.num_chanels=3").removeprefix("invalid configuration:\n  ")
    assert message.endswith(f"allowed here: {', '.join(ModelConfig.model_fields)}")
    documented(message)


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

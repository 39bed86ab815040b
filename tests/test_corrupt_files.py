"""Damaged files name themselves (docs/errors.md): corrupt, truncated or missing zarr chunks and metadata, duplicate
variable names (YAML syntax errors in config files: test_yaml_errors.py). Messages are checked word for word."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zarr
from bad_input_helpers import TINY_DATA, VARIABLES, assert_cli_cases, message_of, tiny_dataset
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch._utils import ExceptionWrapper

from anemo_like.config import RunConfig
from anemo_like.config.inference import inference_config_dir, validate_inference_config
from anemo_like.data.setup import setup_data
from anemo_like.data.zarr_store import CorruptDatasetError, open_anemoi_zarr
from anemo_like.data.zarr_writer import write_anemoi_zarr

TAIL = "the file is truncated or corrupted: re-copy or rebuild the dataset"
HOLDS = "variables cos_latitude, sin_latitude, cos_longitude, ... (7 variables)"  # every chunk holds all 7
FORMATS = pytest.mark.parametrize("zarr_format", [2, 3], ids=["zarr-v2", "zarr-v3"])


# --------------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[int, Path]:
    """The tiny dataset of test_bad_inputs in zarr format 2 and 3, written once; tests damage copies."""
    folder = tmp_path_factory.mktemp("pristine")
    return {fmt: tiny_dataset(folder / f"v{fmt}.zarr", zarr_format=fmt) for fmt in (2, 3)}


@pytest.fixture
def copy_of(pristine, tmp_path) -> Callable[[int], Path]:
    """copy_of(zarr_format) -> a fresh copy of the pristine dataset, free to damage."""
    return lambda zarr_format=2: Path(shutil.copytree(pristine[zarr_format], tmp_path / f"d{zarr_format}.zarr"))


@pytest.fixture
def tiny_run(tmp_path, compose_run) -> Callable[..., RunConfig]:
    """tiny_run(dataset, *overrides) -> validated config of a tiny model on ``dataset``."""
    return lambda dataset, *overrides: compose_run(
        tmp_path / "run", [f"data.dataset={dataset}", *TINY_DATA, *overrides]
    )


def data_chunk(path: Path, date: int) -> Path:
    """The chunk file of one date of ``data``: flat keys in both formats (see write_anemoi_zarr)."""
    return path / "data" / (f"{date}.0.0.0" if (path / ".zgroup").exists() else f"c.{date}.0.0.0")


def small_chunk(path: Path, key: str) -> Path:
    """The single chunk file of a small array (dates, latitudes, statistics)."""
    return path / key / ("0" if (path / ".zgroup").exists() else "c/0")


def truncate(file: Path, size: int | None = None) -> None:
    """Keep the first ``size`` bytes of ``file`` (default: half of it)."""
    raw = file.read_bytes()
    file.write_bytes(raw[: len(raw) // 2 if size is None else size])


def overwrite(file: Path, offset: int = 20, length: int = 40) -> None:
    """Flip ``length`` bytes from ``offset`` to 0xff, as a bad disk block or a botched copy would."""
    raw = bytearray(file.read_bytes())
    raw[offset : offset + length] = b"\xff" * length
    file.write_bytes(bytes(raw))


# ------------------------------------------------------------------------------------------ corrupt chunks
@FORMATS
@pytest.mark.parametrize(
    "damage, reason",
    [(truncate, "-1"), (overwrite, "-1"), (lambda file: truncate(file, 0), "0")],
    ids=["truncated", "overwritten bytes", "empty file"],
)
def test_undecodable_data_chunk_names_file_dates_and_variables(copy_of, zarr_format, damage, reason) -> None:
    path = copy_of(zarr_format)
    damage(data_chunk(path, 1))
    store = open_anemoi_zarr(path)
    message = message_of(lambda: store.read(slice(0, 3), np.arange(7)), CorruptDatasetError)
    assert message == (
        f"{data_chunk(path, 1)}: cannot decode this chunk of array 'data' (date 2000-01-01T06:00:00, {HOLDS}): "
        f"error during blosc decompression: {reason}; {TAIL}"
    )


def test_undecodable_chunk_in_a_training_sample_and_from_a_loader_worker(copy_of, tiny_run) -> None:
    path = copy_of(2)
    overwrite(data_chunk(path, 2))
    train = setup_data(tiny_run(path, "training.val_climatology_dates=0")).train
    expected = (
        f"{data_chunk(path, 2)}: cannot decode this chunk of array 'data' (date 2000-01-01T12:00:00, {HOLDS}): "
        f"error during blosc decompression: -1; {TAIL}"
    )
    assert message_of(lambda: train[0], CorruptDatasetError) == expected
    try:
        train[1]
    except CorruptDatasetError:  # what a DataLoader worker sends back: the error's type and formatted traceback
        from_worker = ExceptionWrapper(where="in DataLoader worker process 0")
    assert message_of(from_worker.reraise, CorruptDatasetError) == expected  # as the DataLoader re-raises it


@FORMATS
@pytest.mark.parametrize(
    "key, damage, reason",
    [
        ("stdev", lambda file: truncate(file, 0), "error during blosc decompression: 0"),
        ("mean", truncate, "its blosc header gives 72 bytes but the file has 36"),  # blosc alone reads on
        ("latitudes", truncate, "its blosc header gives 74 bytes but the file has 37"),
        ("dates", lambda file: truncate(file, 10), "error during blosc decompression: -1"),
    ],
    ids=["empty stdev", "truncated mean", "truncated latitudes", "dates cut to 10 bytes"],
)
def test_undecodable_small_array_fails_at_setup(copy_of, tiny_run, zarr_format, key, damage, reason) -> None:
    path = copy_of(zarr_format)
    damage(small_chunk(path, key))
    message = message_of(lambda: setup_data(tiny_run(path)), CorruptDatasetError)
    assert message == f"{small_chunk(path, key)}: cannot decode this chunk of array '{key}': {reason}; {TAIL}"


@FORMATS
def test_missing_data_chunk_file_is_reported_at_open(copy_of, zarr_format) -> None:
    path = copy_of(zarr_format)
    data_chunk(path, 5).unlink()  # zarr would read it as NaN
    assert message_of(lambda: open_anemoi_zarr(path), CorruptDatasetError) == (
        f"{data_chunk(path, 5)}: the chunk file of array 'data' (date 2000-01-02T06:00:00, {HOLDS}) is missing, "
        "so zarr would read it as its fill value (nan); re-copy or rebuild the dataset, or list its dates in the "
        "'missing_dates' attribute if they are missing on purpose"
    )


def test_chunks_of_dates_listed_as_missing_read_as_nan(copy_of) -> None:
    path = copy_of(2)
    data_chunk(path, 5).unlink()
    zarr.open_group(path, mode="r+").attrs["missing_dates"] = ["2000-01-02T06:00:00"]
    assert np.isnan(open_anemoi_zarr(path).read(slice(5, 6), np.arange(7))).all()


def test_an_all_nan_date_is_written_as_a_chunk_file(tmp_path) -> None:
    def blank_date_3(data: np.ndarray) -> None:
        data[3] = np.nan

    path = tiny_dataset(tmp_path / "d.zarr", edit=blank_date_3)
    assert data_chunk(path, 3).is_file()
    assert np.isnan(open_anemoi_zarr(path).read(slice(3, 4), np.arange(7))).all()


# ---------------------------------------------------------------------------------------- broken metadata
@pytest.mark.parametrize(
    "zarr_format, relative, content, problem",
    [
        (2, "data/.zarray", '{"zarr_format": 2, "shape": [20, 7', "not valid JSON: Expecting ',' delimiter "),
        (2, "data/.zattrs", "", "it is empty"),
        (2, ".zattrs", "\x00\xff\xfe binary", "it is not text (binary content)"),
        (2, ".zgroup", '{"zarr_format": 2', "not valid JSON: Expecting ',' delimiter (line 1, column 18)"),
        (2, "stdev/.zarray", '{"hello": 1}', "it lacks the key(s) 'zarr_format', 'shape', 'chunks', 'dtype' of "),
        (3, "data/zarr.json", "[1, 2]", "expected a JSON object, found an array"),
        (3, "zarr.json", '{"zarr_format": 3,\n "node_type": "group",\n "attributes": {"variables": [\n', None),
    ],
    ids=[
        "truncated .zarray",
        "empty .zattrs",
        "binary group .zattrs",
        "truncated .zgroup",
        "wrong .zarray",
        "v3 list",
        "v3 truncated group",
    ],
)
def test_broken_metadata_file_is_named(pristine, tmp_path, zarr_format, relative, content, problem) -> None:
    path = Path(shutil.copytree(pristine[zarr_format], tmp_path / "d.zarr"))
    (path / relative).write_bytes(content.encode("latin-1"))
    problem = problem or "not valid JSON: Expecting value (line 4, column 1)"
    if problem.endswith("delimiter "):
        problem += "(line 1, column 35)"
    if problem.endswith("of "):
        problem += "zarr metadata"
    assert message_of(lambda: open_anemoi_zarr(path), CorruptDatasetError) == (
        f"{path / relative}: cannot read this zarr metadata file: {problem}; {TAIL}"
    )


@pytest.mark.parametrize(
    "zarr_format, edit, reason",
    [
        (
            2,
            {"dtype": "nonsense"},
            "No Zarr data type found that matches {'name': 'nonsense', 'object_codec_id': None}",
        ),
        (3, {"shape": "abc"}, "Expected an iterable of integers. Got abc instead."),
    ],
    ids=["zarr-v2 dtype", "zarr-v3 shape"],
)
def test_metadata_zarr_refuses_is_named(copy_of, tiny_run, zarr_format, edit, reason) -> None:
    path = copy_of(zarr_format)
    file = path / "data" / (".zarray" if zarr_format == 2 else "zarr.json")
    file.write_text(json.dumps({**json.loads(file.read_text()), **edit}))
    assert message_of(lambda: setup_data(tiny_run(path)), CorruptDatasetError) == (
        f"{file}: cannot read this zarr metadata file: zarr cannot read it ({reason}); {TAIL}"
    )


# ---------------------------------------------------------------------------------- duplicate variable names
@pytest.mark.parametrize(
    "names, listed",
    [
        ([*VARIABLES[:5], "t_850", "t_850"], "'t_850' twice (positions 5 and 6)"),
        ([*VARIABLES[:4], "sp", "sp", "sp"], "'sp' 3 times (positions 4, 5 and 6)"),
        (
            ["sp", "sp", *VARIABLES[2:4], "t_850", "z_500", "z_500"],
            "'sp' twice (positions 0 and 1), 'z_500' twice (positions 5 and 6)",
        ),
    ],
    ids=["one name twice", "one name three times", "two names twice"],
)
def test_duplicate_variable_names_are_refused_at_open(copy_of, names, listed) -> None:
    path = copy_of(2)
    zarr.open_group(path, mode="r+").attrs["variables"] = names
    assert message_of(lambda: open_anemoi_zarr(path)) == (
        f"{path}: 'variables' lists {listed}; each variable needs its own name: rename or drop the duplicate "
        "(fix the attribute or rebuild the dataset)"
    )


def test_duplicate_variable_names_fail_at_setup_and_are_not_written(copy_of, tiny_run, tmp_path) -> None:
    path = copy_of(3)
    zarr.open_group(path, mode="r+").attrs["variables"] = [*VARIABLES[:6], "t_850"]
    message = message_of(lambda: setup_data(tiny_run(path)))
    assert message.startswith(f"{path}: 'variables' lists 't_850' twice (positions 5 and 6); ")
    target = tmp_path / "dup.zarr"
    with pytest.raises(ValueError, match=r"'variables' lists 'sp' twice \(positions 0 and 1\)"):
        write_anemoi_zarr(
            target,
            data=np.zeros((2, 2, 1, 3)),
            variables=["sp", "sp"],
            dates=np.array(["2000-01-01T00", "2000-01-01T06"], dtype="datetime64[s]"),
            latitudes=np.zeros(3),
            longitudes=np.zeros(3),
            frequency="6h",
        )
    assert not target.exists()


# ----------------------------------------------------------------------------------- anemo-train / anemo-infer
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, compose_run, pristine) -> Path:
    """inference.pt of the tiny model trained one step on the pristine v2 dataset."""
    from anemo_like.training.trainer import Trainer

    run_dir = tmp_path_factory.mktemp("trained")
    overrides = [f"data.dataset={pristine[2]}", *TINY_DATA, "training.max_steps=1", "training.val_climatology_dates=0"]
    Trainer(compose_run(run_dir, overrides)).fit()
    return run_dir / "inference.pt"


def test_undecodable_chunk_read_by_anemo_infer(checkpoint, copy_of, tmp_path) -> None:
    from anemo_like.inference.run import run_inference

    path = copy_of(2)
    truncate(data_chunk(path, 9))
    overrides = [f"checkpoint={checkpoint}", f"dataset={path}", "dates=[2000-01-03T00]", "lead_time=6h"]
    with initialize_config_dir(config_dir=str(inference_config_dir()), version_base="1.3"):
        cfg = compose(config_name="default", overrides=[*overrides, f"output={tmp_path / 'forecast.nc'}"])
    config = validate_inference_config(OmegaConf.to_container(cfg, resolve=True))
    assert message_of(lambda: run_inference(config), CorruptDatasetError) == (  # date 9 is the last input state
        f"{data_chunk(path, 9)}: cannot decode this chunk of array 'data' (date 2000-01-03T06:00:00, {HOLDS}): "
        f"error during blosc decompression: -1; {TAIL}"
    )


def test_cli_damaged_dataset_is_one_message(copy_of, tmp_path) -> None:
    during_training, at_setup = copy_of(2), copy_of(3)
    overwrite(data_chunk(during_training, 12))  # the first validation state, read by a loader worker
    truncate(small_chunk(at_setup, "stdev"), 0)
    cases = {
        "chunk read during training": (
            [f"data.dataset={during_training}", *TINY_DATA, "dataloader.num_workers.val=1"],
            1,
            f"anemo-train failed: CorruptDatasetError: {data_chunk(during_training, 12)}: cannot decode this chunk of "
            f"array 'data' (date 2000-01-04T00:00:00, {HOLDS}): error during blosc decompression: -1; {TAIL}\n",
        ),
        "statistics read at setup": (
            [f"data.dataset={at_setup}", *TINY_DATA],
            2,
            f"{small_chunk(at_setup, 'stdev')}: cannot decode this chunk of array 'stdev': "
            f"error during blosc decompression: 0; {TAIL}\n",
        ),
    }
    assert_cli_cases(tmp_path, cases)

"""Contradictions and impossibilities in the config, refused before any training step with one message naming the
keys, values and what to do: a training batch above the split's samples, lr_min above lr, overlapping train and
validation windows and more mapper chunks than nodes (impossible single values: test_config_ranges.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import bad_input_helpers
import pytest
import torch
from bad_input_helpers import TINY_DATA, config_error, message_of
from conftest import latlon_graph
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from test_data_parallel import launch, wait_all
from test_model import make_model

from anemo_like.config import RunConfig, config_dir, validate_config
from anemo_like.data.setup import LoaderOptions, setup_data
from anemo_like.runtime.inference_environment import apply_inference_overrides
from anemo_like.runtime.memory_plan import check_chunks_fit_graph, resolve_auto_settings
from anemo_like.training.setup import build_run

CHUNK_VARIABLES = (
    "ANEMOI_INFERENCE_NUM_CHUNKS",
    "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER",
    "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR",
)
# The tiny dataset (tests/bad_input_helpers.py): 20 dates, 2000-01-01T00 .. 2000-01-05T18, 6-hourly, 128 grid points.
# TINY_DATA splits it into train (None .. 2000-01-03T18: 12 dates, 10 samples of 3 states) and val (2000-01-04T00 ..
# None: 8 dates, 6 samples); graph.mesh_resolution=1 (conftest.TINY_MODEL) gives 42 hidden nodes.
TRAIN = "data.splits.train (None .. 2000-01-03T18)"

dataset, tiny_run = bad_input_helpers.dataset, bad_input_helpers.tiny_run  # the shared fixtures


@pytest.fixture
def clean_env(monkeypatch):
    for name in CHUNK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def accepted(*overrides: str) -> RunConfig:
    """The quickstart config with these command-line overrides, validated (raises when refused)."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name="quickstart", overrides=[*overrides, "system.paths.output=/tmp/unused"])
    return validate_config(OmegaConf.to_container(cfg, resolve=True))


def one_problem(line: str) -> str:
    return f"invalid configuration:\n  {line}"


# ------------------------------------------------------------------------------- training batch above the samples
def test_train_batch_above_the_samples_is_refused(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("dataloader.batch_size.train=11")))
    assert message == (
        f"dataloader.batch_size.train=11 is more than the 10 samples of {TRAIN} of {dataset}: a batch would repeat "
        "samples; lower dataloader.batch_size.train to at most 10 or widen the split"
    )


def test_train_batch_of_exactly_the_samples_is_accepted(tiny_run) -> None:
    data = setup_data(tiny_run("dataloader.batch_size.train=10"))
    batches = iter(data.train_loader(LoaderOptions(batch_size=10), seed=0, start_sample=0))
    assert len(data.train) == 10 and sorted(next(batches)[:, 0, 0, 0].tolist()) == sorted(
        data.train[i][0, 0, 0].item() for i in range(10)
    ), "one batch holds every sample once"


def test_global_batch_over_data_parallel_instances_is_refused(tiny_run, dataset) -> None:
    config = tiny_run("dataloader.batch_size.train=6")
    assert len(setup_data(config, data_parallel_size=1).train) == 10  # 6 on one instance fits
    message = message_of(lambda: setup_data(config, data_parallel_size=2))
    assert message == (
        "dataloader.batch_size.train=6 on each of 2 data-parallel model instances (12 a step) is more than the 10 "
        f"samples of {TRAIN} of {dataset}: a batch would repeat samples; lower dataloader.batch_size.train to at most "
        "5 or widen the split"
    )
    setup_data(tiny_run("dataloader.batch_size.train=5"), data_parallel_size=2)  # 10 a step: every sample once


@pytest.mark.slow
def test_two_ranks_refuse_a_global_batch_above_the_samples_at_setup(tmp_path, dataset) -> None:
    """anemo-train on two ranks: the data-parallel size comes from the open process group; rank 0 exits 2 with the
    message (the other rank, waiting for rank 0 to set up the data first, then fails on the closed connection)."""
    overrides = [f"data.dataset={dataset}", *TINY_DATA, "dataloader.batch_size.train=6"]
    (code, output), _ = wait_all(launch(tmp_path / "run", tmp_path / "cache", overrides, world=2), 120)
    assert code == 2 and "Traceback" not in output, output
    assert (
        "dataloader.batch_size.train=6 on each of 2 data-parallel model instances (12 a step) is more than the 10 "
        f"samples of {TRAIN} of {dataset}: a batch would repeat samples; lower dataloader.batch_size.train to at most "
        "5 or widen the split"
    ) in output


def test_more_data_parallel_instances_than_samples_is_refused(tiny_run, dataset) -> None:
    message = message_of(lambda: setup_data(tiny_run("dataloader.batch_size.train=1"), data_parallel_size=16))
    assert message == (
        "dataloader.batch_size.train=1 on each of 16 data-parallel model instances (16 a step) is more than the 10 "
        f"samples of {TRAIN} of {dataset}: a batch would repeat samples; run fewer data-parallel model instances or "
        "widen the split"
    )


def test_train_batch_is_counted_in_samples_not_dates(tiny_run, dataset) -> None:
    """12 training dates hold 12 - (2 + 3 - 1) = 8 windows of 2 inputs and a rollout of 3."""
    message = message_of(lambda: setup_data(tiny_run("training.rollout.max=3", "dataloader.batch_size.train=9")))
    assert message == (
        f"dataloader.batch_size.train=9 is more than the 8 samples of {TRAIN} of {dataset}: a batch would repeat "
        "samples; lower dataloader.batch_size.train to at most 8 or widen the split"
    )


def test_validation_batch_above_the_samples_scores_each_sample_once(tiny_run) -> None:
    """Not a contradiction: the validation loader keeps its last, short batch (here the only one)."""
    data = setup_data(tiny_run("dataloader.batch_size.val=16"))
    batches = list(data.val_loader(LoaderOptions(batch_size=16)))
    assert len(data.val) == 6 and [len(batch) for batch in batches] == [6]


# ------------------------------------------------------------------------------------------------ lr_min above lr
@pytest.mark.parametrize(
    "overrides, line",
    [
        (
            ["training.optimizer.lr_min=0.01"],
            "config section 'training.optimizer': lr_min (0.01) must be at most lr (0.002): the schedule decays lr "
            "down to lr_min",
        ),
        (
            ["training.optimizer.lr=1e-4", "training.optimizer.lr_min=1e-3"],
            "config section 'training.optimizer': lr_min (0.001) must be at most lr (0.0001): the schedule decays lr "
            "down to lr_min",
        ),
        (
            ["training.optimizer.lr=0.002", "training.optimizer.lr_min=0.0020001"],
            "config section 'training.optimizer': lr_min (0.0020001) must be at most lr (0.002): the schedule decays "
            "lr down to lr_min",
        ),
    ],
    ids=["lr_min above the quickstart lr", "both set", "just above"],
)
def test_lr_min_above_lr_is_refused(overrides: list[str], line: str) -> None:
    assert config_error(*overrides) == one_problem(line)


@pytest.mark.parametrize("lr_min", ["0.002", "0", "1e-5"], ids=["equal: constant after warm-up", "zero", "below"])
def test_lr_min_up_to_lr_is_accepted(lr_min: str) -> None:
    assert accepted(f"training.optimizer.lr_min={lr_min}").training.optimizer.lr_min == float(lr_min)


# ----------------------------------------------------------------------------- overlapping train and val windows
def overlap_message(train: str, val: str, dataset: Path, shared: str) -> str:
    return (
        f"data.splits.train ({train}) and data.splits.val ({val}) of {dataset} share {shared}: validation would "
        "score dates the model trained on; make the windows disjoint or set data.splits.allow_overlap=true"
    )


@pytest.mark.parametrize(
    "overrides, train, val, shared",
    [
        (
            ["data.splits.train.end='2000-01-04T00'"],
            "None .. 2000-01-04T00",
            "2000-01-04T00 .. None",
            "1 date(s), 2000-01-04T00:00:00 .. 2000-01-04T00:00:00",
        ),
        (
            ["data.splits.train.end=null", "data.splits.val.end='2000-01-04T18'"],
            "None .. None",
            "2000-01-04T00 .. 2000-01-04T18",
            "4 date(s), 2000-01-04T00:00:00 .. 2000-01-04T18:00:00",
        ),
        (
            ["data.splits.train.end=null", "data.splits.val.start=null"],
            "None .. None",
            "None .. None",
            "20 date(s), 2000-01-01T00:00:00 .. 2000-01-05T18:00:00",
        ),
        (
            ["data.splits.train.start='2000-01-03'", "data.splits.train.end='2000-01-05T00'"],
            "2000-01-03 .. 2000-01-05T00",
            "2000-01-04T00 .. None",
            "5 date(s), 2000-01-04T00:00:00 .. 2000-01-05T00:00:00",
        ),
    ],
    ids=["by one date", "val inside train", "identical windows", "val starts inside train"],
)
def test_overlapping_splits_are_refused(tiny_run, dataset, overrides, train, val, shared) -> None:
    message = message_of(lambda: setup_data(tiny_run(*overrides)))
    assert message == overlap_message(train, val, dataset, shared)


def test_overlap_is_refused_when_val_dataset_names_the_same_dataset(tiny_run, dataset) -> None:
    same = dataset.parent / ".." / dataset.parent.name / dataset.name  # another spelling of the path
    message = message_of(lambda: setup_data(tiny_run(f"data.val_dataset={same}", "data.splits.val.start=null")))
    shared = "12 date(s), 2000-01-01T00:00:00 .. 2000-01-03T18:00:00"
    assert message == overlap_message("None .. 2000-01-03T18", "None .. None", dataset, shared)


def test_overlap_is_accepted_with_allow_overlap(tiny_run) -> None:
    data = setup_data(
        tiny_run("data.splits.train.end=null", "data.splits.val.start=null", "data.splits.allow_overlap=true")
    )
    assert (len(data.train), len(data.val)) == (18, 18)


def test_overlap_is_accepted_on_a_val_dataset_of_its_own(tiny_run, dataset, tmp_path) -> None:
    """Another trajectory on the same dates: its states are not the training ones."""
    other = shutil.copytree(dataset, tmp_path / "other-trajectory.zarr")
    data = setup_data(tiny_run(f"data.val_dataset={other}", "data.splits.train.end=null", "data.splits.val.start=null"))
    assert data.val.store.path == other and (len(data.train), len(data.val)) == (18, 18)


def test_adjacent_splits_are_accepted(tiny_run) -> None:
    data = setup_data(tiny_run())  # train ends 2000-01-03T18, val starts 2000-01-04T00
    assert data.train.date_stop == data.val.date_start == 12


# ---------------------------------------------------------------------------------------- chunks above the nodes
def test_encoder_chunks_above_the_hidden_nodes_are_refused_at_setup(tiny_run) -> None:
    message = message_of(lambda: build_run(tiny_run("model.encoder.num_chunks=64")))
    assert message == (
        "model.encoder.num_chunks=64 is more than the 42 hidden (mesh) nodes the encoder maps to, so a chunk would "
        "hold no node; set model.encoder.num_chunks to at most 32 or auto"
    )


def test_decoder_chunks_above_the_data_nodes_are_refused_at_setup(tiny_run) -> None:
    message = message_of(lambda: build_run(tiny_run("model.decoder.num_chunks=256")))
    assert message == (
        "model.decoder.num_chunks=256 is more than the 128 data nodes (grid points) the decoder maps to, so a chunk "
        "would hold no node; set model.decoder.num_chunks to at most 128 or auto"
    )


def test_chunks_up_to_the_nodes_are_accepted(tiny_run) -> None:
    graph = latlon_graph(8, 16, 1)  # the tiny grid: 128 data nodes, 42 hidden nodes
    config = tiny_run("model.encoder.num_chunks=32", "model.decoder.num_chunks=128")
    check_chunks_fit_graph(config.model, graph)


def test_auto_chunks_stay_within_the_nodes(tiny_run) -> None:
    config = tiny_run("model.encoder.num_chunks=auto", "model.decoder.num_chunks=auto")
    graph = latlon_graph(8, 16, 1)  # the tiny grid: 128 data nodes, 42 hidden nodes
    model, plan = resolve_auto_settings(  # nothing fits in 1 KiB: the plan with the smallest predicted peak
        config.model, graph=graph, batch_size=2, num_parameters=10_000, budget_bytes=1024, device=torch.device("cpu")
    )
    assert not plan.fits
    assert model.encoder.num_chunks <= 42 and model.decoder.num_chunks <= 128  # hidden / data nodes


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        (
            "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER",
            "64",
            "environment variable ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER='64': more chunks than the 42 destination nodes "
            "of the encoder; set at most 42 or unset it",
        ),
        (
            "ANEMOI_INFERENCE_NUM_CHUNKS",
            "43",
            "environment variable ANEMOI_INFERENCE_NUM_CHUNKS='43': more chunks than the 42 destination nodes of the "
            "encoder; set at most 42 or unset it",
        ),
        (
            "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR",
            "100",
            "environment variable ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR='100': more chunks than the 42 nodes of "
            "the processor; set at most 42 or unset it",
        ),
    ],
    ids=["mapper", "both", "processor"],
)
def test_inference_chunks_above_the_nodes_are_refused(clean_env, variable: str, value: str, expected: str) -> None:
    model = make_model(latlon_graph(8, 16, 1))
    clean_env.setenv(variable, value)
    assert message_of(lambda: apply_inference_overrides(model)) == expected


def test_inference_mapper_chunks_above_the_decoder_nodes_are_refused(clean_env) -> None:
    model = make_model(latlon_graph(4, 8, 1))  # 32 data nodes, fewer than the 42 hidden ones
    clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER", "40")
    assert message_of(lambda: apply_inference_overrides(model)) == (
        "environment variable ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER='40': more chunks than the 32 destination nodes of "
        "the decoder; set at most 32 or unset it"
    )


def test_inference_chunks_up_to_the_nodes_are_accepted(clean_env) -> None:
    model = make_model(latlon_graph(8, 16, 1))
    clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS", "42")
    apply_inference_overrides(model)
    assert model.encoder.eval_num_chunks == model.decoder.eval_num_chunks == model.processor.eval_num_chunks == 42


def test_inference_chunks_above_the_nodes_are_refused_at_training_setup(tiny_run, clean_env) -> None:
    clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER", "64")
    assert message_of(lambda: build_run(tiny_run())) == (
        "environment variable ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER='64': more chunks than the 42 destination nodes "
        "of the encoder; set at most 42 or unset it"
    )

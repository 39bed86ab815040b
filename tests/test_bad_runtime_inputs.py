"""Bad inputs met while running (docs/errors.md): NaN or inf in the data, a damaged graph cache, a bad
``training.resume`` checkpoint, bad environment variables, and the command line's one message without a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import bad_input_helpers
import numpy as np
import pytest
import torch
from bad_input_helpers import (
    N_LAT,
    N_LON,
    TINY_DATA,
    Payload,
    assert_cli_cases,
    message_of,
    run_cli,
    set_values,
    tiny_dataset,
    tiny_grid,
)
from conftest import TINY_MODEL
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch._utils import ExceptionWrapper

from anemo_like.checkpoints.training import load_training_checkpoint
from anemo_like.config import config_dir, validate_config
from anemo_like.config.schema import ModelConfig
from anemo_like.data.setup import setup_data
from anemo_like.data.window_dataset import NonFiniteDataError
from anemo_like.distributed.environment import launch_rank, select_device
from anemo_like.graphs.cache import graph_cache_key, load_or_build_graph
from anemo_like.runtime.inference_environment import (
    check_inference_environment,
    inference_num_chunks,
    with_graph_backend_from_environment,
)
from anemo_like.training.loss import WeightedMSE
from anemo_like.training.trainer import Trainer

dataset, tiny_run = bad_input_helpers.dataset, bad_input_helpers.tiny_run  # the shared fixtures


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


def test_cli_debug_shows_the_traceback(tmp_path) -> None:
    process = run_cli(tmp_path, "--debug", f"data.dataset={tmp_path / 'nowhere.zarr'}")
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "Traceback (most recent call last)" in output and "FileNotFoundError" in output


def test_errors_doc_catalogues_at_least_25_cases() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "errors.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| bad input")]
    assert len(rows) >= 25

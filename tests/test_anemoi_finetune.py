"""Fine-tuning a model imported from anemoi: ``training.init_model=checkpoint`` trains it on its own graph, variables
and normalisation (anemoi_finetune.yaml); its validation loss falls, a resumed run continues bit for bit, and a
dataset of other variables or another grid is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from anemoi_helpers import golden, imported
from conftest import SHARED_DATASET
from inference_helpers import documented
from resume_helpers import Killed, die_after_checkpoint

from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.training.trainer import Trainer

STEPS = ["training.max_steps=30", "training.val_every_n_steps=10", "training.checkpoint_every_n_steps=10"]
SMALL = ["dataloader.limit_batches.val=4", "training.val_climatology_dates=0", "diagnostics.plots=false"]


def records(metrics: Path, key: str) -> dict[int, float]:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r[key] for r in lines if key in r}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return imported("default", tmp_path_factory.mktemp("imported"))


def finetune(compose_run, folder: Path, model: Path, dataset: Path, *overrides: str):
    arguments = [f"data.dataset={dataset}", f"training.init_from={model}", *STEPS, *SMALL, *overrides]
    return compose_run(folder, arguments, name="anemoi_finetune")


@pytest.mark.skipif(not SHARED_DATASET.exists(), reason="needs ../shared/data/hs-t21-seed1-1y.zarr")
def test_an_imported_model_fine_tunes_on_its_graph_and_resumes_exactly(tmp_path, compose_run, model, monkeypatch):
    config = finetune(compose_run, tmp_path / "full", model, SHARED_DATASET)
    trainer = Trainer(config)
    assert trainer.config.model.num_channels == 32, "the checkpoint's architecture, not this config's"
    assert trainer.config.data.variables.computed_forcing == ["cos_latitude", "cos_longitude", "sin_latitude",
                                                            "sin_longitude"]  # fmt: skip
    source = torch.load(model, weights_only=True)["state_dict"]
    start = {name: tensor.clone() for name, tensor in trainer.model.state_dict().items()}
    assert all(torch.equal(start[name], tensor) for name, tensor in source.items()), "every weight loaded"
    full = trainer.fit()
    validation = records(full.metrics, "val_loss")
    assert sorted(validation) == [10, 20, 30] and validation[30] < validation[10], validation

    die_after_checkpoint(monkeypatch, 20)
    with pytest.raises(Killed):
        Trainer(finetune(compose_run, tmp_path / "cut", model, SHARED_DATASET)).fit()
    monkeypatch.undo()
    resumed = Trainer(finetune(compose_run, tmp_path / "cut", model, SHARED_DATASET, "training.resume=auto")).fit()
    assert records(resumed.metrics, "train_loss") == records(full.metrics, "train_loss")
    ours, theirs = (torch.load(run.training_checkpoint, weights_only=True)["model"] for run in (resumed, full))
    assert all(torch.equal(ours[name], tensor) for name, tensor in theirs.items())


def _dataset(path: Path, *, drop: str | None = None, grid_shift: float = 0.0) -> Path:
    """40 dates of the golden window's variables on its grid (or a shifted one), one variable dropped."""
    g = golden("default")
    names = [str(v) for v in g["variables"]]
    keep = [i for i, name in enumerate(names) if name != drop]
    values = np.concatenate([g["values"]] * 7)[:40, keep, None, :]
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(40) * np.timedelta64(6, "h")
    return write_anemoi_zarr(
        path,
        data=values,
        variables=[names[i] for i in keep],
        dates=dates,
        latitudes=g["latitudes"],
        longitudes=(g["longitudes"] + grid_shift) % 360.0,
        frequency="6h",
    )


SPLITS = ["data.splits.train.end=2000-01-07T18", "data.splits.val.start=2000-01-08T00"]


def test_a_dataset_without_a_variable_of_the_model_is_refused_by_name(tmp_path, compose_run, model) -> None:
    dataset = _dataset(tmp_path / "no_z500.zarr", drop="z_500")
    with pytest.raises(ValueError, match=r"unknown variable\(s\) 'z_500'"):
        Trainer(finetune(compose_run, tmp_path / "run", model, dataset, *SPLITS))
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_dataset_of_another_grid_is_refused(tmp_path, compose_run, model) -> None:
    dataset = _dataset(tmp_path / "shifted.zarr", grid_shift=2.0)
    with pytest.raises(ValueError) as error:
        Trainer(finetune(compose_run, tmp_path / "run", model, dataset, *SPLITS))
    assert str(error.value) == (
        f"training.init_model=checkpoint: data.dataset {dataset} has points up to 2 degrees from the model's grid "
        f"points (the model of {model}); fine-tune it on a dataset of its own grid"
    )
    documented(str(error.value), DATA=dataset, FILE=model)


def test_an_imported_model_is_trained_only_as_it_is(tmp_path, compose_run, model) -> None:
    dataset = _dataset(tmp_path / "data.zarr")
    with pytest.raises(ValueError) as error:
        Trainer(finetune(compose_run, tmp_path / "run", model, dataset, *SPLITS, "training.init_model=config"))
    assert str(error.value) == (
        f"training.init_from={model} holds an anemoi model (imported by anemo-import), whose graph, variables and "
        "normalisation are anemoi's: set training.init_model=checkpoint to train it as it is"
    )
    documented(str(error.value), FILE=model)


def test_the_model_of_a_checkpoint_needs_an_inference_checkpoint(tmp_path, compose_run, model) -> None:
    dataset = _dataset(tmp_path / "data.zarr")
    steps = ["training.max_steps=1", "training.val_every_n_steps=1", "training.checkpoint_every_n_steps=1"]
    Trainer(finetune(compose_run, tmp_path / "first", model, dataset, *SPLITS, *steps)).fit()
    training_checkpoint = tmp_path / "first" / "checkpoints" / "last.pt"
    with pytest.raises(ValueError) as error:
        Trainer(finetune(compose_run, tmp_path / "run", training_checkpoint, dataset, *SPLITS))
    documented(str(error.value), FILE=training_checkpoint)
    with pytest.raises(ValueError) as error:
        finetune(compose_run, tmp_path / "run", model, dataset, *SPLITS, "training.init_from=null")
    documented(str(error.value).split("\n  ", 1)[1], FILE=model)

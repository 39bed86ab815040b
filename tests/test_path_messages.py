"""Paths that are not what a key wants (docs/errors.md): a run folder or a checkpoints folder given as a checkpoint,
links that lead nowhere, empty files, a checkpoints folder as the run folder, a stored config that no longer
validates, every module frozen, and the synthetic dataset script's empty grids. Each is one message naming the key
or file and what to do."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bad_input_helpers import TINY_DATA, message_of, tiny_dataset
from inference_helpers import documented

import anemo_like
from anemo_like.checkpoints.inference import load_inference_checkpoint
from anemo_like.checkpoints.training import load_training_checkpoint, read_resume_state, resume_path
from anemo_like.checkpoints.weights import read_checkpoint_weights
from anemo_like.config.schema import ModelConfig
from anemo_like.data.grids import grid_from_name
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.training.run_folder import check_run_folder_is_free
from anemo_like.training.trainer import Trainer
from anemo_like.training.warm_start import freeze_modules

SYNTHETIC_DATASET = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "synthetic_dataset.py"
LOADERS = {
    "training.resume": load_training_checkpoint,
    "training.init_from": lambda path: read_checkpoint_weights(path, key="training.init_from"),
    "checkpoint": load_inference_checkpoint,
}
STEPS = "step-000000002.pt, step-000000001.pt"


@pytest.fixture(scope="module")
def run(tmp_path_factory, compose_run) -> Path:
    """The folder of a finished 2-step run of the tiny dataset, a checkpoint at each step."""
    folder = tmp_path_factory.mktemp("paths")
    dataset = tiny_dataset(folder / "tiny.zarr")
    overrides = [f"data.dataset={dataset}", *TINY_DATA, "training.checkpoint_every_n_steps=1"]
    Trainer(compose_run(folder / "run", [*overrides, "system.hardware.num_threads=1"])).fit()
    return folder / "run"


def refusal(key: str, path: Path) -> str:
    return message_of(lambda: LOADERS[key](path))


# ----------------------------------------------------------------------------------- a folder, not a file
@pytest.mark.parametrize(
    ("inside", "kind", "rows"),
    [
        ("", "the run folder of an anemo-train run", set(LOADERS)),
        ("checkpoints", "the checkpoints folder of an anemo-train run", {"training.resume", "checkpoint"}),
    ],
)
def test_a_run_folder_given_as_a_checkpoint_names_the_files_to_pass(run, inside, kind, rows) -> None:
    folder = run / inside if inside else run
    head = f"{folder} is a folder ({kind}), not a checkpoint file; pass a checkpoint file, e.g."
    messages = {key: refusal(key, folder) for key in LOADERS}
    assert messages == {
        "training.resume": f"training.resume: {head} training.resume={run}/checkpoints/last.pt (also there: "
        f"{STEPS}), or training.resume=auto with system.paths.output={run}",
        "training.init_from": f"training.init_from: {head} training.init_from={run}/inference.pt (also there: "
        "checkpoints/last.pt, checkpoints/step-000000002.pt, checkpoints/step-000000001.pt)",
        "checkpoint": f"checkpoint: {head} checkpoint={run}/inference.pt",
    }
    for key in rows:
        documented(messages[key], RUN=run)


ODD_PATHS = {  # (kind of path, key): the message after "KEY: PATH ", and whether docs/errors.md shows it
    ("folder", "training.resume"): (
        "is a folder, not a checkpoint file, and holds no last.pt or step-*.pt; pass a checkpoint file "
        "(training.resume=FILE)",
        True,
    ),
    ("folder", "training.init_from"): (
        "is a folder, not a checkpoint file, and holds no inference.pt, last.pt or step-*.pt; pass a checkpoint "
        "file (training.init_from=FILE)",
        False,
    ),
    ("loop", "training.resume"): (
        "is a symbolic link that leads back to itself (a loop); point it at a checkpoint file, or pass the file itself",
        True,
    ),
    ("dangling", "checkpoint"): (
        "is a symbolic link to TMP/moved.pt, which does not exist; point it at a checkpoint file, or pass the file "
        "itself",
        False,
    ),
}


@pytest.mark.parametrize(("kind", "key"), list(ODD_PATHS))
def test_paths_that_are_no_checkpoint_file_say_what_they_are(tmp_path, kind, key) -> None:
    path = tmp_path / f"{kind}.pt"  # named like a checkpoint: a folder, a link to itself, a link to nothing
    if kind == "folder":
        path.mkdir()
    else:
        path.symlink_to(path if kind == "loop" else tmp_path / "moved.pt")
    expected, in_docs = ODD_PATHS[kind, key]
    message = refusal(key, path)
    assert message == f"{key}: {path} {expected.replace('TMP', str(tmp_path))}"
    if in_docs:
        documented(message, FILE=path)


def test_the_folder_of_an_unfinished_run_says_how_to_finish_it(run, tmp_path) -> None:
    unfinished = Path(shutil.copytree(run / "checkpoints", tmp_path / "run" / "checkpoints")).parent
    message = refusal("checkpoint", unfinished)
    assert message == (
        f"checkpoint: {unfinished} is a folder, not a checkpoint file, and holds no inference.pt: its run has not "
        f"finished (training.resume=auto with system.paths.output={unfinished} finishes it and writes "
        f"{unfinished}/inference.pt); pass a checkpoint file (checkpoint=FILE)"
    )
    documented(message, RUN=unfinished)


def test_missing_checkpoints_still_do_not_exist(tmp_path) -> None:
    missing = tmp_path / "nothing.pt"
    assert message_of(lambda: load_inference_checkpoint(missing), FileNotFoundError) == (
        f"inference checkpoint {missing} does not exist"
    )


def test_anemo_infer_given_a_run_folder_exits_2_with_one_line(run, tmp_path) -> None:
    command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={run}", "dates=[2000-01-04T00]"]
    command += [f"output={tmp_path / 'f.nc'}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    output = done.stdout + done.stderr
    assert done.returncode == 2 and "Traceback" not in output, output[-3000:]
    [line] = [line for line in output.splitlines() if "[ERROR] - " in line]
    assert line.endswith(f"checkpoint: {run} is a folder (the run folder of an anemo-train run), not a checkpoint "
                         f"file; pass a checkpoint file, e.g. checkpoint={run}/inference.pt")  # fmt: skip
    assert not (tmp_path / "f.nc").exists()


# ------------------------------------------------------------------------------- links, empty files, folders
def test_a_dataset_path_that_links_to_itself_is_named_a_loop(tmp_path) -> None:
    loop = tmp_path / "loop.zarr"
    loop.symlink_to(loop)
    message = message_of(lambda: open_anemoi_zarr(loop), FileNotFoundError)
    assert message == (
        f"{loop}: no such dataset: the path is a symbolic link that leads back to itself (a loop); fix the link, "
        "or give the anemoi-datasets zarr directory itself"
    )
    documented(message, PATH=loop)


def test_an_empty_checkpoint_file_is_named_empty(tmp_path) -> None:
    empty = tmp_path / "last.pt"
    empty.touch()
    message = refusal("training.resume", empty)
    assert message == (
        f"{empty} is not a valid training checkpoint (training.resume): the file is empty (0 bytes: a copy or a "
        "write that did not finish)"
    )
    documented(message, FILE=empty)


def copied_checkpoints(run: Path, tmp_path: Path) -> Path:
    """A copy of the run's checkpoints folder, in a run folder of ``tmp_path``."""
    return Path(shutil.copytree(run / "checkpoints", tmp_path / "run" / "checkpoints"))


def test_a_checkpoints_folder_is_refused_as_the_run_folder(run, tmp_path) -> None:
    folder = copied_checkpoints(run, tmp_path)
    before = sorted(os.listdir(folder))
    message = message_of(lambda: check_run_folder_is_free(folder, resume="auto"))
    assert message == (
        f"system.paths.output {folder} is the checkpoints folder of a run (it holds last.pt), not a run folder: set "
        f"system.paths.output={folder.parent} (with training.resume=auto to continue that run), or choose another "
        "folder"
    )
    assert sorted(os.listdir(folder)) == before
    documented(message, RUN=folder.parent)


def test_resume_auto_without_last_pt_names_the_step_files_instead_of_writing_over_them(run, tmp_path) -> None:
    folder = copied_checkpoints(run, tmp_path)
    (folder / "last.pt").unlink()  # deleted, or lost in a copy
    before = sorted(os.listdir(folder))
    message = message_of(lambda: resume_path("auto", folder))
    assert message == (
        f"training.resume=auto: {folder} holds step checkpoints ({STEPS}) but no last.pt to say which is this run's "
        f"latest; pass the one to resume from, e.g. training.resume={folder}/step-000000002.pt, or choose another "
        "folder (system.paths.output=...)"
    )
    assert sorted(os.listdir(folder)) == before
    documented(message, RUN=folder.parent)
    shutil.rmtree(folder)
    folder.mkdir()
    assert resume_path("auto", folder) is None  # nothing to write over: a fresh start


# ------------------------------------------------------------------------------------------ stored configs
def stale(source: Path, target: Path, version: str | None, **edits: dict) -> Path:
    """A copy of ``source`` whose stored config has ``edits`` ({section: {key: value}}), written by anemo_like
    ``version`` (None: recording none)."""
    state = torch.load(source, weights_only=True)
    config = json.loads(state["config"])
    for section, values in edits.items():
        config[section].update(values)
    version_key = "package_version" if "package_version" in state else "version"  # inference | training format
    state = {**{k: v for k, v in state.items() if k != version_key}, "config": json.dumps(config)}
    torch.save({**state, **({version_key: version} if version else {})}, target)
    return target


UNKNOWN = f"unknown config key 'model.old_key'; allowed here: {', '.join(ModelConfig.model_fields)}"
ZERO = "config key 'training.multistep_input' = 0: expected at least 1"
NOW = anemo_like.__version__


def test_an_inference_checkpoint_whose_config_no_longer_validates_names_file_keys_and_versions(run, tmp_path):
    edits = {"model": {"old_key": 3}, "training": {"multistep_input": 0}}
    older = stale(run / "inference.pt", tmp_path / "older.pt", "0.0.1", **edits)
    message = message_of(lambda: load_inference_checkpoint(older))
    assert message == (
        f"{older} is not a usable inference checkpoint: the config stored in it does not validate with anemo_like "
        f"{NOW} (it was written by anemo_like 0.0.1): use anemo_like 0.0.1 to read it, or train the model again "
        f"with this version; the keys at fault:\n  {UNKNOWN}\n  {ZERO}"
    )
    documented(message.splitlines()[0], FILE=older, VERSION=NOW)
    documented(ZERO)
    edited = stale(run / "inference.pt", tmp_path / "edited.pt", NOW, training={"multistep_input": 0})
    assert message_of(lambda: load_inference_checkpoint(edited)) == (
        f"{edited} is not a usable inference checkpoint: the config stored in it does not validate with anemo_like "
        f"{NOW} (it was written by this version, so it was edited since): use an unedited copy, or train the model "
        f"again with this version; the keys at fault:\n  {ZERO}"
    )
    unversioned = stale(run / "inference.pt", tmp_path / "unversioned.pt", None, model={"old_key": 3})
    assert message_of(lambda: load_inference_checkpoint(unversioned)).split(": use", 1)[0] == (
        f"{unversioned} is not a usable inference checkpoint: the config stored in it does not validate with "
        f"anemo_like {NOW} (it records no version)"
    )


def test_resuming_a_checkpoint_whose_config_no_longer_validates(run, tmp_path) -> None:
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    config, graph = json.loads(state["config"]), state["graph_hash"]
    older = stale(run / "checkpoints" / "last.pt", tmp_path / "older.pt", "0.0.1", model={"old_key": 3})
    message = message_of(lambda: read_resume_state(older, config=config, graph_hash=graph))
    assert message == (
        f"{older} is not a usable training checkpoint (training.resume): the config stored in it does not validate "
        f"with anemo_like {NOW} (it was written by anemo_like 0.0.1): use anemo_like 0.0.1 to read it, or train the "
        f"model again with this version, or start a new run from its weights (training.init_from={older}); the keys "
        f"at fault:\n  {UNKNOWN}"
    )
    documented(message.splitlines()[0], FILE=older, VERSION=NOW)
    # where the weights do not depend on what fails to validate, the run resumes as before
    outside = stale(run / "checkpoints" / "last.pt", tmp_path / "outside.pt", "0.0.1", diagnostics={"x": 1})
    assert read_resume_state(outside, config=config, graph_hash=graph)["step"] == 2


# --------------------------------------------------------------------------------------- every module frozen
def test_freezing_every_module_is_refused_before_the_optimiser(run) -> None:
    model = load_inference_checkpoint(run / "inference.pt").model
    modules = [name for name, _ in model.named_children()]
    message = message_of(lambda: freeze_modules(model, modules))
    assert message == (
        "training.freeze=[data_features, hidden_features, encoder, processor, decoder] freezes every parameter of the "
        "model, so nothing would be trained: leave at least one module out of training.freeze (the top-level "
        "modules: data_features, hidden_features, encoder, processor, decoder)"
    )
    documented(message)
    model = load_inference_checkpoint(run / "inference.pt").model
    assert freeze_modules(model, modules[1:]) > 0  # data_features stays trainable: fine


# ------------------------------------------------------------------------------- benchmarks/data/synthetic_dataset.py
@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (["--grid", "0x10"], "argument --grid: a regular grid NLATxNLON needs NLAT >= 1 and NLON >= 1, got 0x10"),
        (["--grid", "O0"], "argument --grid: an octahedral grid O<N> needs N >= 1, got O0"),
        (["--dates", "0"], "argument --dates: at least 1 date is needed, got 0"),
    ],
)
def test_synthetic_dataset_refuses_empty_grids_and_dates(arguments, error, tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "s.zarr"
    monkeypatch.setattr(sys, "argv", [str(SYNTHETIC_DATASET), "--out", str(out), *arguments])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(SYNTHETIC_DATASET), run_name="__main__")
    assert info.value.code == 2 and not out.exists()
    message = capsys.readouterr().err.splitlines()[-1]
    assert message == f"synthetic_dataset.py: error: {error}"
    documented(message)


def test_regular_grids_need_a_row_and_a_column() -> None:
    assert message_of(lambda: grid_from_name("10x0")) == (
        "a regular grid NLATxNLON needs NLAT >= 1 and NLON >= 1, got 10x0"
    )
    assert grid_from_name("1x1").size == 1


def test_synthetic_dataset_refuses_an_existing_output(tmp_path, monkeypatch, capsys) -> None:
    out = tmp_path / "s.zarr"
    out.mkdir()
    monkeypatch.setattr(sys, "argv", [str(SYNTHETIC_DATASET), "--out", str(out), "--grid", "2x4", "--dates", "1"])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(SYNTHETIC_DATASET), run_name="__main__")
    message = capsys.readouterr().err.splitlines()[-1]
    assert info.value.code == 2 and not any(out.iterdir())
    assert message == (
        f"synthetic_dataset.py: error: argument --out: {out} already exists; remove it first or choose another path"
    )
    documented(message, OUT=out)


def test_synthetic_dataset_refuses_an_output_below_a_file(tmp_path, monkeypatch, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "sub" / "s.zarr"
    monkeypatch.setattr(sys, "argv", [str(SYNTHETIC_DATASET), "--out", str(out)])
    with pytest.raises(SystemExit) as info:
        runpy.run_path(str(SYNTHETIC_DATASET), run_name="__main__")
    assert info.value.code == 2 and blocker.read_text() == ""
    message = capsys.readouterr().err.splitlines()[-1]
    assert message == (
        f"synthetic_dataset.py: error: argument --out: {out} cannot be created: {blocker} is a file, not a folder; "
        "choose a path you can write"
    )
    documented(message.replace(str(out), "OUT").replace(str(blocker), "FILE"))

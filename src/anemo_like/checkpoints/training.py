"""Checkpoints: a training checkpoint that resumes exactly, and a self-contained inference checkpoint.

Both are plain dicts of tensors and Python primitives, loadable with ``torch.load(weights_only=True)``, and are
written atomically (temporary file, fsync, rename): a crash during a save leaves the previous file intact.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

import anemo_like
from anemo_like.atomic_io import atomic_torch_save
from anemo_like.checkpoints.finite import check_finite_weights
from anemo_like.checkpoints.locate import LATEST, STEP_FILES, checkpoint_file, listed, training_checkpoints_in
from anemo_like.checkpoints.stored_config import stored_run_config
from anemo_like.graphs.serialization import load_weights_only

LOG = logging.getLogger(__name__)

TRAINING_FORMAT = "anemo_like-training-v1"


def rng_state() -> dict[str, Any]:
    """RNG states of torch, numpy and Python as tensors/primitives (weights_only-safe)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy"]["keys"].numpy().astype(np.uint32), state["numpy"]["pos"], 0, 0.0))
    random.setstate((state["python"]["version"], tuple(state["python"]["state"]), state["python"]["gauss"]))


def config_hash(config: dict[str, Any]) -> str:
    """16-hex-digit hash of the config sections a checkpoint's weights depend on (``RESUME_MUST_MATCH``)."""
    sections = {section: _section(config, section) for section in RESUME_MUST_MATCH}
    return hashlib.sha256(json.dumps(sections, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_checkpoint_name(step: int) -> str:
    return f"step-{step:09d}.pt"


def save_training_checkpoint(
    folder: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    config_json: str,
    graph_hash: str,
    keep_last: int,
    run_id: str,
    weight_average: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write ``folder/step-<step>.pt`` atomically, make ``folder/last.pt`` point at it (atomic hard link, or an
    atomic copy where the file system has none), and delete all but the newest ``keep_last`` step files of the run
    ``run_id`` (files of other runs are never deleted).

    The checkpoint carries its version metadata: format, package version, config hash, graph hash and run id, and
    the weight average (``training.ema``) when one is kept."""
    path = folder / step_checkpoint_name(step)
    atomic_torch_save(
        {
            "format": TRAINING_FORMAT,
            "version": anemo_like.__version__,
            "config_hash": config_hash(json.loads(config_json)),
            "graph_hash": graph_hash,
            "run_id": run_id,
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(),
            "config": config_json,
            **({"weight_average": weight_average} if weight_average is not None else {}),
        },
        path,
    )
    _point_latest_at(path)
    for old in [p for p in sorted(folder.glob(STEP_FILES)) if checkpoint_run_id(p) == run_id][:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def checkpoint_run_id(path: Path) -> str | None:
    """The run id stored in a training checkpoint (its tensors are memory-mapped, not read); None when the file
    is not a readable checkpoint or predates run ids."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # not ours to judge here: a file we cannot read is never deleted
        return None
    return state.get("run_id") if isinstance(state, dict) else None


def _point_latest_at(path: Path) -> None:
    latest, tmp = path.with_name(LATEST), path.with_name(f".{LATEST}.link")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp)
    except OSError:  # no hard links here: copy (atomically) instead
        atomic_torch_save(torch.load(path, map_location="cpu", weights_only=True), latest)
        return
    os.replace(tmp, latest)


def check_checkpoint_versions(state: dict[str, Any], path: Path, *, config: dict[str, Any], graph_hash: str) -> None:
    """Refuse a checkpoint whose graph differs from this run's; warn when another package version wrote it."""
    saved_graph = state.get("graph_hash")
    if saved_graph is not None and saved_graph != graph_hash:
        raise ValueError(
            f"training.resume: {path} was trained on another graph (hash {saved_graph}, this run's is {graph_hash}): "
            "the dataset grid or the graph settings changed"
        )
    version = state.get("version")
    if version is not None and version != anemo_like.__version__:
        LOG.warning("%s was written by anemo_like %s, this is %s", path, version, anemo_like.__version__)
    saved_hash = state.get("config_hash")
    if saved_hash is not None and saved_hash != config_hash(config):
        LOG.info("%s: config hash %s differs from this run's %s", path, saved_hash, config_hash(config))


def load_training_checkpoint(path: Path) -> dict[str, Any]:
    """Read a training checkpoint; raises naming the file when it is missing, a folder, corrupted, unsafe or of
    another format."""
    missing = f"training checkpoint {path} does not exist (training.resume)"
    checkpoint_file(path, key="training.resume", formats=("training",), missing=missing)
    state = load_weights_only(path, what="training checkpoint (training.resume)")
    if not isinstance(state, dict) or state.get("format") != TRAINING_FORMAT:
        raise ValueError(f"{path} is not an anemo_like training checkpoint (expected format {TRAINING_FORMAT})")
    check_finite_weights(state.get("model", {}), path, what="training checkpoint (training.resume)")
    return state


# Sections of the config that must match for a checkpoint's weights and optimizer state to fit the run ...
RESUME_MUST_MATCH = (
    "model",
    "graph",
    "data.variables",
    "data.normalizer",
    "data.timestep",
    "training.multistep_input",
    "training.multistep_output",
    "training.freeze",
)
# ... except keys that change how the model runs, not its weights (e.g. more chunks after an out-of-memory).
RESUME_MAY_DIFFER = (
    "num_chunks",
    "shard_strategy",
    "gradient_checkpointing",
    "graph_attention_backend",
    "attention_implementation",
)


def _section(config: dict[str, Any], dotted: str) -> Any:
    """``config["a"]["b"]`` for ``"a.b"`` ({} where a level is missing)."""
    for part in dotted.split("."):
        config = config.get(part, {})
    return config


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}.{key}").items()}
    return {prefix: value}


def resume_mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys under RESUME_MUST_MATCH whose values differ between two config dicts, as 'key: saved -> current'."""
    differences = []
    for section in RESUME_MUST_MATCH:
        flat_old = _flatten(_section(saved, section), section)
        flat_new = _flatten(_section(current, section), section)
        for key in sorted(flat_old.keys() | flat_new.keys()):
            if key.rsplit(".", 1)[-1] not in RESUME_MAY_DIFFER and flat_old.get(key) != flat_new.get(key):
                differences.append(f"{key}: {flat_old.get(key)!r} -> {flat_new.get(key)!r}")
    return differences


def read_resume_state(path: Path, *, config: dict[str, Any], graph_hash: str) -> dict[str, Any]:
    """The training checkpoint at ``path``, refused unless it fits the run of ``config`` (a JSON dict) on the
    graph of ``graph_hash``: same graph, same values under RESUME_MUST_MATCH."""
    state = load_training_checkpoint(path)
    check_checkpoint_versions(state, path, config=config, graph_hash=graph_hash)
    saved, unreadable = _saved_config(state, path)
    mismatches = resume_mismatches(saved, config)
    if mismatches and unreadable is not None:  # not comparable: say why
        raise unreadable
    if mismatches:
        raise ValueError(
            f"training.resume: {path} was written by a run whose config differs where the weights depend on it:\n  "
            + "\n  ".join(mismatches)
        )
    return state


def resume_path(resume: str | None, folder: Path) -> Path | None:
    """The checkpoint ``training.resume`` names: a path, or with ``auto`` ``folder``'s latest (None: start afresh)."""
    if resume != "auto":
        return None if resume is None else Path(resume).expanduser()
    held = training_checkpoints_in(folder)  # last.pt first, when there is one
    if held and held[0].name == LATEST:
        return held[0]
    if held:  # starting afresh would write over them
        raise ValueError(
            f"training.resume=auto: {folder} holds step checkpoints ({listed([p.name for p in held], 3)}) but no "
            f"{LATEST} to say which is this run's latest; pass the one to resume from, e.g. training.resume={held[0]}, "
            "or choose another folder (system.paths.output=...)"
        )
    LOG.info("training.resume=auto: no checkpoint in %s yet, starting from step 0", folder)
    return None


def _saved_config(state: dict[str, Any], path: Path) -> tuple[dict[str, Any], ValueError | None]:
    """A checkpoint's saved config with the defaults of keys added since it was written; as it was, with the error
    naming what no longer validates, if it does not."""
    also = f", or start a new run from its weights (training.init_from={path})"
    what = "training checkpoint (training.resume)"
    try:
        config = stored_run_config(state["config"], path, what=what, version=state.get("version"), also=also)
    except ValueError as error:
        return json.loads(state["config"]), error
    return config.model_dump(mode="json"), None

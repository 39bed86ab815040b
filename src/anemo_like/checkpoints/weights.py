"""The weights of either checkpoint format, for a warm start: ``inference.pt`` or a training checkpoint, with the
hash of the graph they were trained on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor
from torch_geometric.data import HeteroData

from anemo_like.checkpoints.finite import check_finite_weights
from anemo_like.checkpoints.inference import INFERENCE_FORMAT, saved_normalizer
from anemo_like.checkpoints.locate import checkpoint_file
from anemo_like.checkpoints.stored_config import stored_run_config
from anemo_like.checkpoints.training import TRAINING_FORMAT
from anemo_like.config.schema import RunConfig
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.variables import VariableLayout, VariableRoles
from anemo_like.graphs.serialization import graph_from_tensors, load_weights_only, tensors_fingerprint


@dataclass(frozen=True)
class StoredModel:
    """The model an inference checkpoint describes, beside its weights: the run config it was made with, its
    variable roles and layout, and its graph."""

    config: RunConfig
    roles: VariableRoles
    layout: VariableLayout
    graph: HeteroData


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint's state dict (on the CPU), the fingerprint of its graph and, for an inference checkpoint, its
    normalisation statistics and the model it describes."""

    path: Path
    state_dict: dict[str, Tensor]
    normalizer: Normalizer | None  # None: a training checkpoint, which holds none
    graph_hash: str | None  # :func:`~anemo_like.graphs.graph_fingerprint` (None: a file that records none)
    provenance: dict[str, Any]  # where weights made elsewhere come from ({}: trained here, or a training checkpoint)
    model: StoredModel | None = None  # read with ``with_model``; None otherwise and for a training checkpoint


def _stored_model(state: dict[str, Any], path: Path, key: str) -> StoredModel:
    version = state.get("package_version")
    return StoredModel(
        config=stored_run_config(state["config"], path, what=f"checkpoint ({key})", version=version),
        roles=VariableRoles(**state["roles"]),
        layout=VariableLayout(**state["layout"]),
        graph=graph_from_tensors(state["graph"]),
    )


def read_checkpoint_weights(path: Path, *, key: str, with_model: bool = False) -> CheckpointWeights:
    """Read ``path`` (either format, ``weights_only``); errors name the config ``key`` that gave the path.
    ``with_model``: also the model an inference checkpoint describes (its config, roles, layout and graph)."""
    missing = f"{key}: {path} does not exist; give an inference.pt or a training checkpoint"
    checkpoint_file(path, key=key, formats=("inference", "training"), missing=missing)
    state = load_weights_only(path, what=f"checkpoint ({key})")
    fmt = state.get("format") if isinstance(state, dict) else None
    model = None
    if fmt == INFERENCE_FORMAT:
        weights, normalizer = state["state_dict"], saved_normalizer(state["normalizer"])
        graph_hash = tensors_fingerprint(state["graph"]) if isinstance(state.get("graph"), dict) else None
        model = _stored_model(state, path, key) if with_model and graph_hash is not None else None
    elif fmt == TRAINING_FORMAT:
        weights, normalizer, graph_hash = state["model"], None, state.get("graph_hash")
    else:
        raise ValueError(
            f"{key}: {path} is not an anemo_like checkpoint (expected format {INFERENCE_FORMAT} or {TRAINING_FORMAT})"
        )
    check_finite_weights(weights, path, what=f"checkpoint ({key})")
    provenance = json.loads(state.get("provenance", "{}")) if fmt == INFERENCE_FORMAT else {}
    return CheckpointWeights(path, weights, normalizer, graph_hash, provenance, model)

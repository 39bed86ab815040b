"""The weights of either checkpoint format, for a warm start: ``inference.pt`` or a training checkpoint, with the
hash of the graph they were trained on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from anemo_like.checkpoints.finite import check_finite_weights
from anemo_like.checkpoints.inference import INFERENCE_FORMAT, saved_normalizer
from anemo_like.checkpoints.locate import checkpoint_file
from anemo_like.checkpoints.training import TRAINING_FORMAT
from anemo_like.data.normalizer import Normalizer
from anemo_like.graphs.serialization import load_weights_only, tensors_fingerprint


@dataclass(frozen=True)
class CheckpointWeights:
    """A checkpoint's state dict (on the CPU), the fingerprint of its graph and, for an inference checkpoint, its
    normalisation statistics."""

    path: Path
    state_dict: dict[str, Tensor]
    normalizer: Normalizer | None  # None: a training checkpoint, which holds none
    graph_hash: str | None  # :func:`~anemo_like.graphs.graph_fingerprint` (None: a file that records none)


def read_checkpoint_weights(path: Path, *, key: str) -> CheckpointWeights:
    """Read ``path`` (either format, ``weights_only``); errors name the config ``key`` that gave the path."""
    missing = f"{key}: {path} does not exist; give an inference.pt or a training checkpoint"
    checkpoint_file(path, key=key, formats=("inference", "training"), missing=missing)
    state = load_weights_only(path, what=f"checkpoint ({key})")
    fmt = state.get("format") if isinstance(state, dict) else None
    if fmt == INFERENCE_FORMAT:
        weights, normalizer = state["state_dict"], saved_normalizer(state["normalizer"])
        graph_hash = tensors_fingerprint(state["graph"]) if isinstance(state.get("graph"), dict) else None
    elif fmt == TRAINING_FORMAT:
        weights, normalizer, graph_hash = state["model"], None, state.get("graph_hash")
    else:
        raise ValueError(
            f"{key}: {path} is not an anemo_like checkpoint (expected format {INFERENCE_FORMAT} or {TRAINING_FORMAT})"
        )
    check_finite_weights(weights, path, what=f"checkpoint ({key})")
    return CheckpointWeights(path=path, state_dict=weights, normalizer=normalizer, graph_hash=graph_hash)

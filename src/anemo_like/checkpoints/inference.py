"""The inference checkpoint: weights plus everything needed to run the model (config, variables, statistics, graph).

Saved as plain tensors and primitives, so ``torch.load(path, weights_only=True)`` reads it without importing or
trusting pickled code.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import HeteroData

import anemo_like
from anemo_like.atomic_io import atomic_torch_save
from anemo_like.checkpoints.finite import check_finite_weights
from anemo_like.checkpoints.locate import checkpoint_file
from anemo_like.checkpoints.stored_config import stored_run_config
from anemo_like.config.schema import RunConfig
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.variables import VariableLayout, VariableRoles
from anemo_like.graphs import graph_from_tensors, graph_to_tensors
from anemo_like.graphs.serialization import load_weights_only
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.runtime.inference_environment import apply_inference_overrides, with_graph_backend_from_environment
from anemo_like.runtime.weight_paging import give_back, mapped_ranges

LOG = logging.getLogger(__name__)
INFERENCE_FORMAT = "anemo_like-inference-v1"


@dataclass
class InferenceBundle:
    """A ready-to-run model and what it was trained with."""

    model: ForecastModel
    config: RunConfig
    roles: VariableRoles
    normalizer: Normalizer
    graph: HeteroData
    # the training dataset's variables_metadata of the model's variables (units, mars keys); {}: an older checkpoint
    variables_metadata: dict[str, dict[str, Any]] = field(default_factory=dict)
    # where the weights come from when not trained here (anemo-import: anemoi versions, run id, source file hash)
    provenance: dict[str, Any] = field(default_factory=dict)


def save_inference_checkpoint(
    path: Path,
    *,
    model: ForecastModel,
    config: RunConfig,
    roles: VariableRoles,
    normalizer: Normalizer,
    graph: HeteroData,
    variables_metadata: dict[str, dict[str, Any]],
    provenance: dict[str, Any] | None = None,
) -> None:
    """Write the checkpoint; ``variables_metadata``: the dataset's entries of the model's variables, ``provenance``:
    where weights made elsewhere come from (both JSON-able)."""
    layout = asdict(model.layout)
    atomic_torch_save(
        {
            "format": INFERENCE_FORMAT,
            "package_version": anemo_like.__version__,
            "config": config.model_dump_json(),
            "state_dict": model.state_dict(),
            "graph": graph_to_tensors(graph),
            "roles": asdict(roles),
            "layout": layout,
            "normalizer": {
                "names": normalizer.names,
                "offset": torch.from_numpy(normalizer.offset),
                "scale": torch.from_numpy(normalizer.scale),
            },
            "variables_metadata": json.dumps(variables_metadata, default=str),
            **({"provenance": json.dumps(provenance, default=str)} if provenance else {}),
        },
        path,
    )


def saved_normalizer(saved: dict[str, Any]) -> Normalizer:
    """The normaliser an inference checkpoint stores (``names``, ``offset`` and ``scale`` tensors)."""
    return Normalizer(list(saved["names"]), np.asarray(saved["offset"]), np.asarray(saved["scale"]))


def load_inference_checkpoint(path: str | Path, *, device: str | torch.device = "cpu") -> InferenceBundle:
    """Rebuild the model from an inference checkpoint (``weights_only=True``), in eval mode on ``device``. The weights
    are mapped from the file (one copy in memory, read as first used), not copied into a model built beside them."""
    path = Path(path)
    missing = f"inference checkpoint {path} does not exist"
    checkpoint_file(path, key="checkpoint", formats=("inference",), missing=missing)
    state: dict[str, Any] = load_weights_only(path, what="inference checkpoint", mmap=True)
    if not isinstance(state, dict) or state.get("format") != INFERENCE_FORMAT:
        raise ValueError(f"{path} is not an anemo_like inference checkpoint (expected format {INFERENCE_FORMAT})")
    mapped = mapped_ranges(path)  # the file's tensors are read where they are used: the check gives its reads back
    check_finite_weights(
        state["state_dict"], path, what="inference checkpoint", after_each=lambda t: give_back([t], mapped)
    )
    version = state.get("package_version")
    config = stored_run_config(state["config"], path, what="inference checkpoint", version=version)
    config = config.model_copy(update={"model": with_graph_backend_from_environment(config.model)})
    graph = graph_from_tensors(state["graph"])
    layout = VariableLayout(**state["layout"])
    with torch.device("meta"):  # parameters without memory or initialisation: the file's tensors take their place
        model = ForecastModel(
            config=config.model,
            graph=graph,
            layout=layout,
            multistep=config.training.multistep_input,
            output_steps=config.training.multistep_output,
        )
    model.load_state_dict(state["state_dict"], assign=True)
    empty = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if empty:
        raise ValueError(f"{path} is not a usable inference checkpoint: it holds no {', '.join(empty[:5])}")
    apply_inference_overrides(model)
    normalizer = saved_normalizer(state["normalizer"])
    metadata = json.loads(state.get("variables_metadata", "{}"))
    roles = VariableRoles(**state["roles"])
    provenance = json.loads(state.get("provenance", "{}"))
    return InferenceBundle(
        model.to(device).eval(), config, roles, normalizer, graph, variables_metadata=metadata, provenance=provenance
    )

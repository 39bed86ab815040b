"""The tensors of an anemoi model, the same whichever kind of file they come from.

An ``inference-*.ckpt`` pickles the module itself (weights, buffers, pre/post-processors, the graph); Lightning's
``last.ckpt`` holds its ``state_dict`` (prefix ``model.``) and, in ``hyper_parameters``, the graph and statistics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from anemo_like.anemoi_import.archive import AnemoiArchive, ImportRefused
from anemo_like.anemoi_import.safe_pickle import Inert, module_tensors, stored_mapping

MODEL_PREFIX = "model.model."  # of the network's tensors in a Lightning state_dict
PROCESSORS = "pre_processors.{dataset}.processors."


@dataclass(frozen=True)
class AnemoiContent:
    """One dataset's model: ``tensors`` are the network's parameters and persistent buffers by their anemoi names
    (``encoder.0.proc.lin_key.weight``, ...); ``processors`` the pre-processors' buffers (``normalizer._norm_mul``);
    ``statistics`` (mean, stdev, minimum, maximum: (V_data,) float64, dataset order); ``nodes`` and ``edges`` the
    graph's stores as pickled (node ``x``: (N, 2) latitude and longitude in radians; raw, unsorted edges)."""

    tensors: dict[str, Tensor]
    processors: dict[str, Tensor]
    statistics: dict[str, np.ndarray]
    nodes: dict[str, dict[str, Any]]
    edges: dict[tuple[str, str, str], dict[str, Any]]


def _child(module: Any, *names: str) -> Any:
    for name in names:
        module = (module.state.get("_modules") or {}).get(name) if isinstance(module, Inert) else None
    return module


def _graph_stores(graph: Any, path: str) -> tuple[dict, dict]:
    state = graph.state if isinstance(graph, Inert) and isinstance(graph.state, dict) else None
    if state is None or "_node_store_dict" not in state:
        raise ImportRefused(
            f"{path}: its graph_data is not a torch-geometric HeteroData; a layout anemo-import does not know"
        )
    nodes = {name: stored_mapping(store) for name, store in state["_node_store_dict"].items()}
    edges = {tuple(key): stored_mapping(store) for key, store in state["_edge_store_dict"].items()}
    return nodes, edges


def _statistics(raw: Any, dataset: str, path: str) -> dict[str, np.ndarray]:
    stats = raw.get(dataset) if isinstance(raw, dict) else None
    if not isinstance(stats, dict) or not {"mean", "stdev", "minimum", "maximum"} <= set(stats):
        raise ImportRefused(f"{path}: it holds no statistics (mean, stdev, minimum, maximum) of dataset '{dataset}'")
    return {key: np.asarray(stats[key], dtype=np.float64) for key in ("mean", "stdev", "minimum", "maximum")}


def _from_inference(archive: AnemoiArchive, dataset: str) -> AnemoiContent:
    root, path = archive.root, str(archive.path)
    model = _child(root, "model")
    if model is None:
        raise ImportRefused(
            f"{path}: the pickled AnemoiModelInterface holds no model; a layout anemo-import does not know"
        )
    processors = _child(root, "pre_processors", dataset, "processors")
    nodes, edges = _graph_stores(root.state.get("graph_data"), path)
    return AnemoiContent(
        tensors=module_tensors(model),
        processors=module_tensors(processors) if processors is not None else {},
        statistics=_statistics(root.state.get("statistics"), dataset, path),
        nodes=nodes,
        edges=edges,
    )


def _from_lightning(archive: AnemoiArchive, dataset: str) -> AnemoiContent:
    state_dict, hyper = archive.root["state_dict"], archive.root["hyper_parameters"]
    path = str(archive.path)
    prefix = "model." + PROCESSORS.format(dataset=dataset)
    nodes, edges = _graph_stores(hyper.get("graph_data"), path)
    return AnemoiContent(
        tensors={k.removeprefix(MODEL_PREFIX): v for k, v in state_dict.items() if k.startswith(MODEL_PREFIX)},
        processors={k.removeprefix(prefix): v for k, v in state_dict.items() if k.startswith(prefix)},
        statistics=_statistics(hyper.get("statistics"), dataset, path),
        nodes=nodes,
        edges=edges,
    )


def read_content(archive: AnemoiArchive, dataset: str) -> AnemoiContent:
    """The model of ``dataset`` in ``archive`` (either kind)."""
    content = (_from_inference if archive.kind == "inference" else _from_lightning)(archive, dataset)
    bad = [name for name, t in content.tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ImportRefused(f"{archive.path}: non-finite weights in {', '.join(bad[:5])}: a diverged training run")
    return content

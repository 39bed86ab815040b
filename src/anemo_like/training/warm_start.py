"""Warm start (``training.init_from``) and freezing (``training.freeze``): the model a fine-tuning run begins with.

A warm start copies, by parameter name, every parameter of a checkpoint whose shape matches this model's; a
parameter whose shape differs (another variable list) keeps its fresh initialisation. The graph-bound parameters
(one row per grid point, mesh node or edge: the trainable node and edge features) are copied only from a checkpoint
of the same graph (equal graph fingerprints): another grid of as many points has the same shapes, but its rows
belong to other points. Buffers are never copied: they are derived from this run's graph and variables.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from anemo_like.checkpoints.weights import CheckpointWeights
from anemo_like.models.edge_features import EdgeFeatures
from anemo_like.models.node_features import NodeFeatures

LOG = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a warm start did with each parameter: names, and why one was not loaded."""

    loaded: list[str] = field(default_factory=list)
    reinitialised: list[tuple[str, str]] = field(default_factory=list)  # name, why ("[16, 32] != [16, 34]")
    missing: list[str] = field(default_factory=list)  # parameters of this model the checkpoint lacks
    unexpected: list[str] = field(default_factory=list)  # checkpoint tensors this model has nothing of that name for
    graphs_differ: str | None = None  # the line saying the checkpoint's graph is not this run's (None: the same)

    def table(self) -> str:
        """The report as a text table: one line per class with its count, then one line per parameter not loaded."""
        lines = [
            *([f"  {self.graphs_differ}"] if self.graphs_differ else []),
            f"  loaded        {len(self.loaded):5d} parameters",
            f"  reinitialised {len(self.reinitialised):5d} (shape here != shape in the checkpoint, or bound to "
            "another graph)",
            *(f"    {name}: {why}" for name, why in self.reinitialised),
            f"  missing       {len(self.missing):5d} (not in the checkpoint: freshly initialised)",
            *(f"    {name}" for name in self.missing),
            f"  unexpected    {len(self.unexpected):5d} (in the checkpoint, not in this model: ignored)",
            *(f"    {name}" for name in self.unexpected),
        ]
        return "\n".join(lines)


def graph_bound_parameters(model: nn.Module) -> set[str]:
    """Names of the parameters with one row per grid point, mesh node or edge of the model's graph: the trainable
    features of :class:`NodeFeatures` and :class:`EdgeFeatures`."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, (NodeFeatures, EdgeFeatures))
        for name, _ in module.named_parameters(recurse=False)
    }


def graphs_differ(source: CheckpointWeights, graph_hash: str) -> str | None:
    """The report's line when ``source`` was trained on another graph than this run's (``graph_hash``), or on one
    it does not record; None for the same graph."""
    if source.graph_hash == graph_hash:
        return None
    keep = "the graph-bound parameters (trainable node and edge features) keep their fresh initialisation"
    if source.graph_hash is None:
        return f"the checkpoint {source.path} records no graph (this run's is {graph_hash}): {keep}"
    return f"graphs differ: {source.path} has graph {source.graph_hash}, this run's is {graph_hash}: {keep}"


def load_matching_weights(model: nn.Module, source: CheckpointWeights, *, graph_hash: str) -> LoadReport:
    """Copy into ``model`` every parameter of ``source`` with this model's name and shape, the graph-bound ones
    only when ``source`` was trained on this run's graph (``graph_hash``); returns the report."""
    report = LoadReport(graphs_differ=graphs_differ(source, graph_hash))
    bound = graph_bound_parameters(model) if report.graphs_differ else set()
    buffers = {name for name, _ in model.named_buffers()}
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, parameter in parameters.items():
            saved = source.state_dict.get(name)
            if saved is None:
                report.missing.append(name)
            elif name in bound:
                report.reinitialised.append((name, "bound to another graph"))
            elif saved.shape != parameter.shape:
                report.reinitialised.append((name, f"{list(parameter.shape)} != {list(saved.shape)}"))
            else:
                parameter.copy_(saved)
                report.loaded.append(name)
    report.unexpected = [name for name in source.state_dict if name not in parameters and name not in buffers]
    LOG.info("training.init_from: weights of %s\n%s", source.path, report.table())
    return report


def freeze_modules(model: nn.Module, paths: list[str]) -> int:
    """Stop training the modules at ``paths`` (``training.freeze``; e.g. ``encoder``, ``processor.layers.0``);
    returns the number of frozen parameter values. An unknown path raises naming it, with the closest names, and so
    does freezing every parameter (the optimiser would have none to train)."""
    modules = dict(model.named_modules())
    frozen = 0
    for path in paths:
        if path not in modules or not path:
            close = difflib.get_close_matches(path, [name for name in modules if name], n=3, cutoff=0.5)
            hint = f"did you mean {' or '.join(close)}?" if close else f"the top-level modules: {_top_level(model)}"
            raise ValueError(f"training.freeze: the model has no module '{path}'; {hint}")
        for parameter in modules[path].parameters():
            if parameter.requires_grad:
                parameter.requires_grad_(False)
                frozen += parameter.numel()
    if paths and not any(parameter.requires_grad for parameter in model.parameters()):
        raise ValueError(
            f"training.freeze=[{', '.join(paths)}] freezes every parameter of the model, so nothing would be trained: "
            f"leave at least one module out of training.freeze (the top-level modules: {_top_level(model)})"
        )
    if paths:
        total = sum(p.numel() for p in model.parameters())
        LOG.info("training.freeze %s: %d of %d parameter values frozen", paths, frozen, total)
    return frozen


def _top_level(model: nn.Module) -> str:
    return ", ".join(name for name, _ in model.named_children())

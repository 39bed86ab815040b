"""Warm start (``training.init_from``) and freezing (``training.freeze``): the model a fine-tuning run begins with.

A warm start copies, by parameter name, every parameter of a checkpoint whose shape matches this model's; a
parameter whose shape differs (another variable list, another graph's trainable node or edge tensors) keeps its
fresh initialisation. Buffers are never copied: they are derived from this run's graph and variables.
"""

from __future__ import annotations

import difflib
import logging
from dataclasses import dataclass, field

import torch
from torch import nn

from anemo_like.checkpoints.weights import CheckpointWeights

LOG = logging.getLogger(__name__)


@dataclass
class LoadReport:
    """What a warm start did with each parameter: names, and both shapes where they differ."""

    loaded: list[str] = field(default_factory=list)
    reinitialised: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)  # name, here, there
    missing: list[str] = field(default_factory=list)  # parameters of this model the checkpoint lacks
    unexpected: list[str] = field(default_factory=list)  # checkpoint tensors this model has nothing of that name for

    def table(self) -> str:
        """The report as a text table: one line per class with its count, then one line per parameter not loaded."""
        lines = [
            f"  loaded        {len(self.loaded):5d} parameters",
            f"  reinitialised {len(self.reinitialised):5d} (shape here != shape in the checkpoint)",
            *(f"    {name}: {list(here)} != {list(there)}" for name, here, there in self.reinitialised),
            f"  missing       {len(self.missing):5d} (not in the checkpoint: freshly initialised)",
            *(f"    {name}" for name in self.missing),
            f"  unexpected    {len(self.unexpected):5d} (in the checkpoint, not in this model: ignored)",
            *(f"    {name}" for name in self.unexpected),
        ]
        return "\n".join(lines)


def load_matching_weights(model: nn.Module, source: CheckpointWeights) -> LoadReport:
    """Copy into ``model`` every parameter of ``source`` with this model's name and shape; returns the report."""
    report = LoadReport()
    buffers = {name for name, _ in model.named_buffers()}
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, parameter in parameters.items():
            saved = source.state_dict.get(name)
            if saved is None:
                report.missing.append(name)
            elif saved.shape != parameter.shape:
                report.reinitialised.append((name, tuple(parameter.shape), tuple(saved.shape)))
            else:
                parameter.copy_(saved)
                report.loaded.append(name)
    report.unexpected = [name for name in source.state_dict if name not in parameters and name not in buffers]
    LOG.info("training.init_from: weights of %s\n%s", source.path, report.table())
    return report


def freeze_modules(model: nn.Module, paths: list[str]) -> int:
    """Stop training the modules at ``paths`` (``training.freeze``; e.g. ``encoder``, ``processor.layers.0``);
    returns the number of frozen parameter values. An unknown path raises naming it, with the closest names."""
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
    if paths:
        total = sum(p.numel() for p in model.parameters())
        LOG.info("training.freeze %s: %d of %d parameter values frozen", paths, frozen, total)
    return frozen


def _top_level(model: nn.Module) -> str:
    return ", ".join(name for name, _ in model.named_children())

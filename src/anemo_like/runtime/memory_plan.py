"""The memory plan: ``num_chunks: auto`` and ``gradient_checkpointing: auto`` resolved to the fastest setting whose
predicted peak step memory fits the budget (``runtime.memory_model`` predicts memory and work).

Every combination of the components' allowed settings is scored: plans that fit are ranked by predicted work
(recomputation costs a forward per component; more mapper chunks reference more shared sources), then by
fewer chunks; when none fits, the plan with the smallest predicted peak is taken and flagged.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch
from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig
from anemo_like.data.variables import VariableLayout
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.ops.workspace import resolve_block_elements
from anemo_like.runtime.memory_model import (
    COMPONENTS,
    ComponentCost,
    activation_peak_bytes,
    component_models,
    static_bytes,
)
from anemo_like.runtime.process_memory import available_memory

LOG = logging.getLogger(__name__)

MAX_AUTO_MAPPER_CHUNKS = 1024
"""``auto`` tries mapper chunk counts up to this (or the destination count, if smaller)."""


@dataclass(frozen=True)
class MemoryPlan:
    """Chunk counts and recomputation per component, the predicted peak step memory (bytes) and step work
    (row-matmul units, ``runtime.memory_model``), and whether the peak fits the budget."""

    components: dict[str, ComponentCost]
    peak_bytes: int
    work: float
    fits: bool

    @property
    def num_chunks(self) -> int:
        """All components' chunk counts together (the tie-break: fewer is simpler)."""
        return sum(c.num_chunks for c in self.components.values())

    def describe(self) -> str:
        return ", ".join(
            f"{c.component} chunks {c.num_chunks} recompute {'on' if c.checkpointing else 'off'}"
            for c in self.components.values()
        )


def _candidates(limit: int) -> list[int]:
    counts, n = [], 1
    while n <= limit:
        counts.append(n)
        n *= 2
    return counts


def _settings(config: ModelConfig, graph: HeteroData) -> dict[str, list[tuple[bool, int]]]:
    """(checkpointing, num_chunks) pairs each component may take: its fixed values, or every choice for auto."""
    limits = {
        "encoder": _candidates(min(graph["hidden"].num_nodes, MAX_AUTO_MAPPER_CHUNKS)),
        "decoder": _candidates(min(graph["data"].num_nodes, MAX_AUTO_MAPPER_CHUNKS)),
        "processor": sorted(set(_candidates(config.processor.num_layers)) | {config.processor.num_layers}),
    }
    settings = {}
    for name in COMPONENTS:
        section = getattr(config, name)
        flags = [True, False] if section.gradient_checkpointing == "auto" else [section.gradient_checkpointing]
        counts = limits[name] if section.num_chunks == "auto" else [section.num_chunks]
        pairs = []
        for flag in flags:
            # without recomputation the processor's segments change nothing: auto takes one
            uniform = name == "processor" and not flag and section.num_chunks == "auto"
            pairs += [(flag, count) for count in (counts[:1] if uniform else counts)]
        settings[name] = pairs
    return settings


def _static_bytes(config: ModelConfig, num_parameters: int, device: torch.device) -> int:
    """Weights, gradients, optimizer moments and the scratch blocks ``config`` gives the kernels on ``device``."""
    return static_bytes(num_parameters, resolve_block_elements(config.resolved_block_elements, device))


def choose_plan(
    *,
    config: ModelConfig,
    graph: HeteroData,
    batch_size: int,
    num_parameters: int,
    budget_bytes: int,
    device: torch.device,
) -> MemoryPlan:
    """The fastest plan whose predicted peak fits ``budget_bytes`` (ties: fewer chunks); when none fits, the one
    with the smallest predicted peak, ``fits=False``. Fixed settings are kept and predicted too. ``device``: where
    the model trains (its scratch blocks depend on it)."""
    models = component_models(config, graph, batch_size)
    options = {name: [models[name].cost(*pair) for pair in pairs] for name, pairs in _settings(config, graph).items()}
    static = _static_bytes(config, num_parameters, device)
    plans = []
    for combination in itertools.product(*(options[name] for name in COMPONENTS)):
        costs = dict(zip(COMPONENTS, combination, strict=True))
        peak = static + activation_peak_bytes(costs)
        plans.append(MemoryPlan(costs, peak, sum(c.step_work for c in combination), peak <= budget_bytes))
    fitting = [plan for plan in plans if plan.fits]
    if fitting:
        return min(fitting, key=lambda plan: (plan.work, plan.num_chunks))
    return min(plans, key=lambda plan: (plan.peak_bytes, plan.work))


def choose_validation_chunks(
    *,
    config: ModelConfig,
    graph: HeteroData,
    batch_size: int,
    num_parameters: int,
    budget_bytes: int,
    device: torch.device,
) -> dict[str, tuple[int, int]]:
    """Mapper chunk counts for forwards without gradients (validation) at ``batch_size``, with the predicted peak
    bytes: for each mapper of the resolved ``config`` the smallest power of two, from its training count up, whose
    predicted peak fits ``budget_bytes`` (the largest tried when none does). Validation batches are often larger
    than training batches, and a mapper without recomputation may train in one chunk."""
    models = component_models(config, graph, batch_size)
    static = _static_bytes(config, num_parameters, device)
    base = static + models["processor"].eval_bytes()
    limits = {"encoder": graph["hidden"].num_nodes, "decoder": graph["data"].num_nodes}
    choices = {}
    for name in ("encoder", "decoder"):
        counts = [
            n for n in _candidates(min(limits[name], MAX_AUTO_MAPPER_CHUNKS)) if n >= getattr(config, name).num_chunks
        ]
        counts = counts or [getattr(config, name).num_chunks]
        for count in counts:  # ascending: stop at the first that fits (each count plans its chunks)
            choices[name] = (count, max(base, static + models[name].eval_bytes(count)))
            if choices[name][1] <= budget_bytes:
                break
    return choices


def apply_validation_chunks(model: ForecastModel, choices: dict[str, tuple[int, int]], batch_size: int) -> None:
    """Give each mapper its validation chunk count as its eval-mode count, where the environment set none
    (``ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER`` wins) and it is more than the training count; logs each change."""
    for name, (count, peak) in choices.items():
        mapper = getattr(model, name)
        if mapper.eval_num_chunks is None and count > mapper.num_chunks:
            mapper.eval_num_chunks = count
            LOG.info(
                "memory plan for validation (batch %d): %s chunks %d (trains in %d), predicted peak %.0f MiB",
                batch_size,
                name,
                count,
                mapper.num_chunks,
                peak / 2**20,
            )


def has_auto_settings(config: ModelConfig) -> bool:
    """Whether any component's ``num_chunks`` or ``gradient_checkpointing`` is ``auto``."""
    return any(
        "auto" in (getattr(config, name).num_chunks, getattr(config, name).gradient_checkpointing)
        for name in COMPONENTS
    )


def resolve_auto_settings(
    config: ModelConfig,
    *,
    graph: HeteroData,
    batch_size: int,
    num_parameters: int,
    budget_bytes: int,
    device: torch.device,
) -> tuple[ModelConfig, MemoryPlan]:
    """``config`` with every ``auto`` replaced by the plan's choice for training on ``device``, and the plan; logs
    the plan and its peak."""
    plan = choose_plan(
        config=config,
        graph=graph,
        batch_size=batch_size,
        num_parameters=num_parameters,
        budget_bytes=budget_bytes,
        device=device,
    )
    updates = {}
    for name, cost in plan.components.items():
        section = getattr(config, name)
        chosen = {"num_chunks": cost.num_chunks, "gradient_checkpointing": cost.checkpointing}
        updates[name] = section.model_copy(
            update={key: chosen[key] for key in chosen if getattr(section, key) == "auto"}
        )
    message = "memory plan: %s; predicted peak step memory %.0f MiB, budget %.0f MiB"
    args = (plan.describe(), plan.peak_bytes / 2**20, budget_bytes / 2**20)
    if plan.fits:
        LOG.info(message, *args)
    else:
        LOG.warning(
            message + " -- over budget even with the most chunks and recomputation: shard the model over more "
            "devices (system.hardware.num_gpus_per_model), shrink the batch or the model",
            *args,
        )
    return config.model_copy(update=updates), plan


def check_chunks_fit_graph(config: ModelConfig, graph: HeteroData) -> None:
    """Refuse a mapper ``num_chunks`` (resolved) above the destination nodes it splits: a chunk would hold none."""
    mappers = (("encoder", "hidden", "hidden (mesh) nodes"), ("decoder", "data", "data nodes (grid points)"))
    for name, nodes, what in mappers:
        chunks, count = getattr(config, name).num_chunks, graph[nodes].num_nodes
        if chunks != "auto" and chunks > count:
            raise ValueError(
                f"model.{name}.num_chunks={chunks} is more than the {count} {what} the {name} maps to, so a chunk "
                f"would hold no node; set model.{name}.num_chunks to at most {1 << (count.bit_length() - 1)} or auto"
            )


def count_parameters(
    config: ModelConfig, graph: HeteroData, layout: VariableLayout, multistep: int, output_steps: int = 1
) -> int:
    """Parameters of the model ``config`` describes (``multistep`` states in, ``output_steps`` out), counted on the
    meta device (no memory, any chunking)."""
    fixed = {
        name: getattr(config, name).model_copy(update={"num_chunks": 1, "gradient_checkpointing": True})
        for name in COMPONENTS
    }
    with torch.device("meta"):
        model = ForecastModel(
            config=config.model_copy(update=fixed),
            graph=graph,
            layout=layout,
            multistep=multistep,
            output_steps=output_steps,
        )
    return sum(p.numel() for p in model.parameters())


def device_memory_bytes(device: torch.device) -> int:
    """80 % of the device's memory: GPU total, or the memory the system has available for a CPU run (within the
    process's address-space limit)."""
    return int(0.8 * available_memory(device).bytes)

"""Predicted training memory of the model per chunk count, and the ``num_chunks: auto`` choice.

Peak memory of one training step = static part (fp32 weights, gradients and the two AdamW moments: 16 bytes
per parameter, plus the kernels' scratch buffers) + the largest activation peak of the three components.
Activation peaks are counted in "rows": one node's feature vector, ``batch * channels * 4`` bytes in fp32.
The coefficients below were measured with ``diagnostics.live_tensors.LiveTensorTracker`` on the reference model
(96x192 grid, mesh 4, 256 channels) for 1-16 chunks and rounded up; ``tests/test_memory.py`` checks that they bound
the measured peak.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch
from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig
from anemo_like.data.variables import VariableLayout
from anemo_like.models.forecast_model import DECODER_EDGES, ENCODER_EDGES, ForecastModel
from anemo_like.models.mlp import ROW_BLOCK_ELEMENTS
from anemo_like.models.ops.chunking import SortedEdges, plan_destination_chunks
from anemo_like.models.ops.graph_attention import BLOCK_ELEMENTS

LOG = logging.getLogger(__name__)

MAPPER_ROWS_PER_DESTINATION = 12.0
"""Live rows per destination node of a mapper chunk at its backward peak (measured 9.6-10.2 at 256 channels;
relatively more at few channels, where edge features and inputs weigh more)."""
MAPPER_ROWS_PER_SOURCE = 8.0
"""Live rows per source node referenced by a mapper chunk (measured 5.6-5.8 at 256 channels; chunks of few
sources, as in Hilbert-ordered meshes, carry relatively more fixed overhead)."""
PROCESSOR_ROWS_PER_LAYER = 8.5
"""Live rows per hidden node and per layer of one processor checkpoint segment (measured 7.6)."""
PROCESSOR_EXTRA_ROWS = 7.0
"""Backward transients of the processor, rows per hidden node (measured 4.7)."""
SCRATCH_BYTES = 4 * (5 * BLOCK_ELEMENTS + 3 * ROW_BLOCK_ELEMENTS)
"""fp32 scratch, allocated once: attention (four per-edge buffers plus two small score buffers, at most five
blocks' worth) and MLP (three row blocks)."""
BYTES_PER_PARAMETER = 16
"""fp32 weight + gradient + two AdamW moments."""
MAX_AUTO_MAPPER_CHUNKS = 1024
"""``auto`` tries mapper chunk counts up to this (or the destination count, if smaller)."""

_COMPONENTS = ("encoder", "processor", "decoder")


@dataclass(frozen=True)
class ChunkChoice:
    """Chunk count of one component and the predicted peak step memory with it, bytes."""

    component: str
    num_chunks: int
    predicted_bytes: int
    fits: bool


def _mapper_activation_bytes(edges: SortedEdges, num_chunks: int, row_bytes: int) -> int:
    chunks = plan_destination_chunks(edges, num_chunks)
    worst = max(
        MAPPER_ROWS_PER_DESTINATION * (c.dst_stop - c.dst_start) + MAPPER_ROWS_PER_SOURCE * c.src_index.numel()
        for c in chunks
    )
    return int(worst * row_bytes)


def _processor_activation_bytes(num_layers: int, num_chunks: int, num_hidden: int, row_bytes: int) -> int:
    layers_per_segment = -(-num_layers // num_chunks)
    return int((PROCESSOR_ROWS_PER_LAYER * layers_per_segment + PROCESSOR_EXTRA_ROWS) * num_hidden * row_bytes)


def static_bytes(num_parameters: int) -> int:
    """Memory that does not depend on chunking: weights, gradients, optimizer moments and scratch buffers."""
    return BYTES_PER_PARAMETER * num_parameters + SCRATCH_BYTES


def _candidates(limit: int) -> list[int]:
    counts, n = [], 1
    while n <= limit:
        counts.append(n)
        n *= 2
    return counts


def choose_chunks(
    *, config: ModelConfig, graph: HeteroData, batch_size: int, num_parameters: int, budget_bytes: int
) -> dict[str, ChunkChoice]:
    """Chunk counts for the components set to ``auto``: the smallest power of two whose predicted peak step
    memory fits ``budget_bytes`` (processor: any count up to the number of layers); the largest count, flagged
    ``fits=False``, when none fits. Components with a fixed count are predicted too."""
    row_bytes = batch_size * config.num_channels * 4
    static = static_bytes(num_parameters)
    encoder_edges = SortedEdges(graph[ENCODER_EDGES].edge_index, graph["hidden"].num_nodes)
    decoder_edges = SortedEdges(graph[DECODER_EDGES].edge_index, graph["data"].num_nodes)
    predictors = {
        "encoder": (
            config.encoder.num_chunks,
            _candidates(min(encoder_edges.num_dst, MAX_AUTO_MAPPER_CHUNKS)),
            lambda n: _mapper_activation_bytes(encoder_edges, n, row_bytes),
        ),
        "decoder": (
            config.decoder.num_chunks,
            _candidates(min(decoder_edges.num_dst, MAX_AUTO_MAPPER_CHUNKS)),
            lambda n: _mapper_activation_bytes(decoder_edges, n, row_bytes),
        ),
        "processor": (
            config.processor.num_chunks,
            sorted(set(_candidates(config.processor.num_layers)) | {config.processor.num_layers}),
            lambda n: _processor_activation_bytes(config.processor.num_layers, n, graph["hidden"].num_nodes, row_bytes),
        ),
    }
    choices = {}
    for component, (setting, candidates, activation_bytes) in predictors.items():
        counts = candidates if setting == "auto" else [setting]
        for count in counts:
            predicted = static + activation_bytes(count)
            if predicted <= budget_bytes or count == counts[-1]:
                choices[component] = ChunkChoice(component, count, predicted, predicted <= budget_bytes)
                break
    return choices


def has_auto_chunks(config: ModelConfig) -> bool:
    """Whether any component's ``num_chunks`` is ``auto``."""
    return any(getattr(config, name).num_chunks == "auto" for name in _COMPONENTS)


def resolve_auto_chunks(
    config: ModelConfig, *, graph: HeteroData, batch_size: int, num_parameters: int, budget_bytes: int
) -> ModelConfig:
    """``config`` with every ``num_chunks: auto`` replaced by its choice; logs each choice and prediction."""
    choices = choose_chunks(
        config=config, graph=graph, batch_size=batch_size, num_parameters=num_parameters, budget_bytes=budget_bytes
    )
    updates = {}
    for component in _COMPONENTS:
        section, choice = getattr(config, component), choices[component]
        if section.num_chunks != "auto":
            continue
        updates[component] = section.model_copy(update={"num_chunks": choice.num_chunks})
        message = "%s num_chunks auto -> %d: predicted peak step memory %.2f GiB, budget %.2f GiB"
        args = (component, choice.num_chunks, choice.predicted_bytes / 2**30, budget_bytes / 2**30)
        if choice.fits:
            LOG.info(message, *args)
        else:
            LOG.warning(
                message + " -- over budget even at the largest count: shard the model over more devices "
                "(system.hardware.num_gpus_per_model), shrink the batch or the model",
                *args,
            )
    return config.model_copy(update=updates)


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


def count_parameters(config: ModelConfig, graph: HeteroData, layout: VariableLayout, multistep: int) -> int:
    """Parameters of the model ``config`` describes, counted on the meta device (no memory, any chunking)."""
    fixed = {name: getattr(config, name).model_copy(update={"num_chunks": 1}) for name in _COMPONENTS}
    with torch.device("meta"):
        model = ForecastModel(config=config.model_copy(update=fixed), graph=graph, layout=layout, multistep=multistep)
    return sum(p.numel() for p in model.parameters())


def device_memory_bytes(device: torch.device) -> int:
    """80 % of the device's memory: GPU total, or the memory the system has available for a CPU run."""
    if device.type == "cuda":
        return int(0.8 * torch.cuda.get_device_properties(device).total_memory)
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(0.8 * int(fields["MemAvailable"].split()[0]) * 1024)
    except (OSError, KeyError, ValueError):
        return int(0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))

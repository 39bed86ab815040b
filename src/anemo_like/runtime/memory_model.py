"""Predicted memory and work of one training step, per component and per setting (chunks, recomputation).

Peak memory of a step = static part (fp32 weights, gradients and the two AdamW moments: 16 bytes per parameter,
plus the kernels' scratch buffers) + the activation peak. Backward runs decoder, processor, encoder; while one
component runs backward, the activations the components before it saved in forward are still held, so

    activation peak = max(decoder.peak + processor.saved + encoder.saved,
                          processor.peak + encoder.saved,
                          encoder.peak)

A checkpointed component saves (almost) nothing and recomputes its forward in backward; one that is not saves
everything its backward needs. Activations are counted in "rows": one node's feature vector, ``batch * channels
* 4`` bytes in fp32. The coefficients were measured with ``diagnostics.live_tensors.LiveTensorTracker`` on the
reference model (96x192 grid, mesh 4, 256 channels, 1 and 4 chunks, recomputation on and off) and on a 64-channel
model, and rounded up; ``tests/test_memory.py`` checks that they bound the measured peaks.

Work is forward work in row-matmul units (one ``channels x channels`` product per row): a step costs about three
forwards (forward, backward), one more per recomputed component.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig
from anemo_like.models.forecast_model import DECODER_EDGES, ENCODER_EDGES, PROCESSOR_EDGES
from anemo_like.models.ops.chunking import SortedEdges, plan_destination_chunks

MAPPER_ROWS_PER_DESTINATION = 12.0
"""Live rows per destination node of a mapper chunk at its backward peak (measured 9.6-10.2 at 256 channels;
relatively more at few channels, where edge features and inputs weigh more)."""
MAPPER_ROWS_PER_SOURCE = 8.0
"""Live rows per source node referenced by a mapper chunk (measured 5.6-5.8 at 256 channels)."""
MAPPER_SAVED_ROWS_PER_DESTINATION = 10.0
"""Rows a mapper chunk without recomputation keeps until backward, per destination node (fit: 9.2)."""
MAPPER_SAVED_ROWS_PER_SOURCE = 4.0
"""... and per source node it references (fit: 3.9)."""
MAPPER_BACKWARD_ROWS_PER_DESTINATION = 1.0
"""Rows a mapper without recomputation adds to what it saved while one chunk runs backward, per destination node
of the chunk (measured 0.4 at 256 channels) ..."""
MAPPER_BACKWARD_ROWS_PER_SOURCE = 3.0
"""... and per source node it references (measured 2.4)."""
PROCESSOR_ROWS_PER_LAYER = 8.5
"""Live rows per hidden node and per layer of one processor checkpoint segment (measured 7.6)."""
PROCESSOR_SAVED_ROWS_PER_LAYER = 9.5
"""Rows a processor layer without recomputation keeps until backward, per hidden node (measured 9.0)."""
CONDITIONAL_NORM_ROWS_PER_LAYER = 4.0
"""Rows a processor layer of an ensemble model keeps on top, per hidden node: each of its two noise-conditioned
LayerNorms keeps the normalised input and the scale factor for backward (derived from the operations, not
fitted)."""
PROCESSOR_EXTRA_ROWS = 10.0
"""Backward transients of the processor and the latent tensors around it (the encoder's output, the gradients
of the processor's input and output), rows per hidden node (measured 4.7 + 2.6)."""
SCRATCH_BLOCKS = 8
"""fp32 scratch blocks (``model.block_elements`` each), allocated once: attention (four per-edge buffers plus two
small score buffers, at most five blocks' worth) and MLP (three row blocks)."""
BYTES_PER_PARAMETER = 16
"""fp32 weight + gradient + two AdamW moments."""

EVAL_ROWS_PER_DESTINATION = 8.0
"""Live rows per destination node of a mapper chunk in a forward without gradients (validation; measured 7.1 at
256 channels) ..."""
EVAL_ROWS_PER_SOURCE = 6.0
"""... and per source node it references (measured 4.2)."""
EVAL_PROCESSOR_ROWS = 12.0
"""Live rows per hidden node of the processor in a forward without gradients, with the latent tensors around it
(measured 9.3)."""
EVAL_CHUNKED_PROCESSOR_ROWS = 6.0
"""... in destination chunks (``ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR``): the layer's input, keys, values and output
and the latent tensors around the processor, per hidden node, besides one chunk's rows (destination rows as a
mapper chunk's, 2 per source: its gathered keys and values)."""
EVAL_CHUNK_ROWS_PER_SOURCE = 2.0

DESTINATION_WORK = 11.0
"""Forward work per destination row: query and output projections, the MLP (8, hidden ratio 4), embedding."""
SOURCE_WORK = 2.5
"""Per source row a chunk references: key and value projections and the source embedding."""
EDGE_WORK = 0.25
"""Per edge: edge embedding, scores and weighted sum (memory-bound; calibrated so that the reference model's
mappers and processor cost what switching their recomputation off saves: 0.58 and 0.56 CPU-s)."""
PROCESSOR_NODE_WORK = 12.0
"""Per hidden node and layer: query, key, value and output projections and the MLP."""
STEP_FORWARDS = 3.0
"""A step without recomputation costs about three forwards (backward about two)."""
COMPONENTS = ("encoder", "processor", "decoder")


@dataclass(frozen=True)
class ComponentCost:
    """One component under one setting: activation bytes at its backward peak, bytes it saves from forward to
    backward, and its forward work (row-matmul units)."""

    component: str
    checkpointing: bool
    num_chunks: int
    peak_bytes: int
    saved_bytes: int
    work: float

    @property
    def step_work(self) -> float:
        """Forward, backward and, when checkpointed, the recomputed forward."""
        return self.work * (STEP_FORWARDS + self.checkpointing)


def static_bytes(num_parameters: int, block_elements: int) -> int:
    """Memory that does not depend on chunking: weights, gradients, optimizer moments and scratch buffers of
    ``block_elements`` per block."""
    return BYTES_PER_PARAMETER * num_parameters + 4 * SCRATCH_BLOCKS * block_elements


def activation_peak_bytes(costs: dict[str, ComponentCost]) -> int:
    """The step's activation peak: each component's backward peak over what earlier components saved."""
    encoder, processor, decoder = (costs[name] for name in COMPONENTS)
    return max(
        decoder.peak_bytes + processor.saved_bytes + encoder.saved_bytes,
        processor.peak_bytes + encoder.saved_bytes,
        encoder.peak_bytes,
    )


class MapperModel:
    """Costs of one mapper over its edges (sorted by destination), per chunk count and recomputation."""

    def __init__(self, component: str, edges: SortedEdges, row_bytes: int) -> None:
        self.component, self.edges, self.row_bytes = component, edges, row_bytes
        self._chunks = cache(lambda n: plan_destination_chunks(edges, n))

    def cost(self, checkpointing: bool, num_chunks: int) -> ComponentCost:
        sizes = [(c.dst_stop - c.dst_start, c.src_index.numel()) for c in self._chunks(num_chunks)]
        if checkpointing:
            peak = max(MAPPER_ROWS_PER_DESTINATION * d + MAPPER_ROWS_PER_SOURCE * s for d, s in sizes)
            kept = 0.0
        else:
            kept = sum(MAPPER_SAVED_ROWS_PER_DESTINATION * d + MAPPER_SAVED_ROWS_PER_SOURCE * s for d, s in sizes)
            backward = (
                MAPPER_BACKWARD_ROWS_PER_DESTINATION * d + MAPPER_BACKWARD_ROWS_PER_SOURCE * s for d, s in sizes
            )
            peak = kept + max(backward)
        work = sum(DESTINATION_WORK * d + SOURCE_WORK * s for d, s in sizes) + EDGE_WORK * self.edges.num_edges
        return ComponentCost(
            self.component, checkpointing, num_chunks, int(peak * self.row_bytes), int(kept * self.row_bytes), work
        )

    def eval_bytes(self, num_chunks: int) -> int:
        """Peak bytes of a forward without gradients (validation) in ``num_chunks`` chunks."""
        chunks = self._chunks(num_chunks)
        rows = max(
            EVAL_ROWS_PER_DESTINATION * (c.dst_stop - c.dst_start) + EVAL_ROWS_PER_SOURCE * c.src_index.numel()
            for c in chunks
        )
        return int(rows * self.row_bytes)


class ProcessorModel:
    """Costs of the processor, per checkpoint segment count and recomputation."""

    def __init__(
        self,
        num_layers: int,
        num_hidden: int,
        num_edges: int,
        row_bytes: int,
        conditional: bool = False,
        edges: SortedEdges | None = None,
    ) -> None:
        """``conditional``: noise-conditioned LayerNorms (an ensemble model's processor); ``edges``: the graph
        processor's (its eval-mode destination chunks; None: a sliding-window processor, never chunked)."""
        self.num_layers, self.num_hidden, self.row_bytes = num_layers, num_hidden, row_bytes
        self.work = num_layers * (PROCESSOR_NODE_WORK * num_hidden + EDGE_WORK * num_edges)
        self.norm_rows = CONDITIONAL_NORM_ROWS_PER_LAYER if conditional else 0.0
        self._chunks = cache(lambda n: plan_destination_chunks(edges, n)) if edges is not None else None

    def cost(self, checkpointing: bool, num_chunks: int) -> ComponentCost:
        if checkpointing:
            layers_per_segment = -(-self.num_layers // num_chunks)
            peak = (PROCESSOR_ROWS_PER_LAYER + self.norm_rows) * layers_per_segment + PROCESSOR_EXTRA_ROWS
            saved = float(num_chunks)  # each segment's input
        else:
            saved = (PROCESSOR_SAVED_ROWS_PER_LAYER + self.norm_rows) * self.num_layers
            peak = saved + PROCESSOR_EXTRA_ROWS
        rows = self.num_hidden * self.row_bytes
        return ComponentCost("processor", checkpointing, num_chunks, int(peak * rows), int(saved * rows), self.work)

    def eval_bytes(self, num_chunks: int = 1) -> int:
        """Peak bytes of a forward without gradients (validation, inference) in ``num_chunks`` destination chunks."""
        if num_chunks == 1 or self._chunks is None:
            return int(EVAL_PROCESSOR_ROWS * self.num_hidden * self.row_bytes)
        chunk = max(
            EVAL_ROWS_PER_DESTINATION * (c.dst_stop - c.dst_start) + EVAL_CHUNK_ROWS_PER_SOURCE * c.src_index.numel()
            for c in self._chunks(num_chunks)
        )
        return int((EVAL_CHUNKED_PROCESSOR_ROWS * self.num_hidden + chunk) * self.row_bytes)


def component_models(
    config: ModelConfig, graph: HeteroData, batch_size: int
) -> dict[str, MapperModel | ProcessorModel]:
    """The cost model of each component of ``config`` on ``graph``."""
    row_bytes = batch_size * config.num_channels * 4
    num_hidden = graph["hidden"].num_nodes
    graph_edges = PROCESSOR_EDGES in graph.edge_types
    processor_edges = (
        graph[PROCESSOR_EDGES].edge_index.shape[1]
        if graph_edges
        else num_hidden * (2 * config.processor.window_size + 1)  # sliding window: every node's neighbours
    )
    return {
        "encoder": MapperModel("encoder", SortedEdges(graph[ENCODER_EDGES].edge_index, num_hidden), row_bytes),
        "processor": ProcessorModel(
            config.processor.num_layers,
            num_hidden,
            processor_edges,
            row_bytes,
            conditional=config.noise is not None,
            edges=SortedEdges(graph[PROCESSOR_EDGES].edge_index, num_hidden) if graph_edges else None,
        ),
        "decoder": MapperModel(
            "decoder", SortedEdges(graph[DECODER_EDGES].edge_index, graph["data"].num_nodes), row_bytes
        ),
    }


def eval_peak_bytes(
    models: dict[str, MapperModel | ProcessorModel], encoder_chunks: int, decoder_chunks: int, processor_chunks: int = 1
) -> int:
    """Activation peak of a forward without gradients (validation, inference): the processor's or a mapper's in its
    chunk count, whichever is larger."""
    return max(
        models["processor"].eval_bytes(processor_chunks),
        models["encoder"].eval_bytes(encoder_chunks),
        models["decoder"].eval_bytes(decoder_chunks),
    )

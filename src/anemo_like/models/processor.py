"""Processors: update the hidden (mesh) node features with a stack of layers.

``GraphTransformerProcessor`` attends over the multi-scale mesh edges; ``TransformerProcessor`` attends over
a sliding window of hidden nodes in their index order. Layers are grouped into ``num_chunks`` checkpoint
segments, so backward stores the inputs of each segment only.
"""

from __future__ import annotations

from torch import Tensor, nn

from anemo_like.models.block import GraphTransformerBlock
from anemo_like.models.checkpointing import run_layer_segments
from anemo_like.models.chunking import SortedEdges
from anemo_like.models.edge_features import EdgeFeatures
from anemo_like.models.inference_chunks import inference_num_chunks
from anemo_like.models.sliding_window import SlidingWindowTransformerLayer
from anemo_like.models.window_attention import Backend


class _ProcessorLayer(nn.Module):
    """A graph-transformer block on one node set (sources are destinations)."""

    def __init__(self, block: GraphTransformerBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: Tensor, *, edge_attr: Tensor, edges: SortedEdges, min_blocks: int) -> Tensor:
        return self.block(x, x, edge_attr, edges, min_blocks)


class GraphTransformerProcessor(nn.Module):
    def __init__(
        self,
        *,
        channels: int,
        num_nodes: int,
        edge_attr: Tensor,
        edge_index: Tensor,
        trainable_edge_size: int,
        num_layers: int,
        num_chunks: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        gradient_checkpointing: bool,
        backend: str,
    ) -> None:
        super().__init__()
        self.num_chunks = num_chunks
        self.gradient_checkpointing = gradient_checkpointing
        self.edges = EdgeFeatures(
            edge_index=edge_index, edge_attr=edge_attr, trainable_size=trainable_edge_size, num_dst=num_nodes
        )
        self.layers = nn.ModuleList(
            _ProcessorLayer(
                GraphTransformerBlock(
                    channels=channels,
                    edge_dim=self.edges.dim,
                    num_heads=num_heads,
                    mlp_hidden_ratio=mlp_hidden_ratio,
                    bipartite=False,
                    backend=backend,
                )
            )
            for _ in range(num_layers)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N_hidden, C) -> (B, N_hidden, C).

        In eval mode ``ANEMOI_INFERENCE_NUM_CHUNKS[_PROCESSOR]`` splits each layer's edges into at least that
        many destination blocks (``torch`` attention backend).
        """
        return run_layer_segments(
            self.layers,
            x,
            num_segments=self.num_chunks,
            checkpointing=self.gradient_checkpointing and self.training,
            edge_attr=self.edges(),
            edges=self.edges.sorted_edges(),
            min_blocks=1 if self.training else inference_num_chunks("PROCESSOR") or 1,
        )


class TransformerProcessor(nn.Module):
    def __init__(
        self,
        *,
        channels: int,
        num_layers: int,
        num_chunks: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        window_size: int,
        attention_implementation: Backend,
        gradient_checkpointing: bool,
    ) -> None:
        super().__init__()
        self.num_chunks = num_chunks
        self.gradient_checkpointing = gradient_checkpointing
        self.layers = nn.ModuleList(
            SlidingWindowTransformerLayer(
                channels=channels,
                num_heads=num_heads,
                mlp_hidden_ratio=mlp_hidden_ratio,
                window_size=window_size,
                attention_implementation=attention_implementation,
            )
            for _ in range(num_layers)
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N_hidden, C) -> (B, N_hidden, C)."""
        return run_layer_segments(
            self.layers, x, num_segments=self.num_chunks, checkpointing=self.gradient_checkpointing and self.training
        )

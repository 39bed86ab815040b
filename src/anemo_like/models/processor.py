"""Processors: update the hidden (mesh) node features with a stack of layers.

``GraphTransformerProcessor`` attends over the multi-scale mesh edges; ``TransformerProcessor`` attends over
a sliding window of hidden nodes in their index order. Layers are grouped into ``num_chunks`` checkpoint
segments, so backward stores the inputs of each segment only.

Sharded over a model group, each rank updates its block of hidden nodes. The graph transformer shards by
``edges`` (each layer exchanges the halo of source rows its block's edges read from other ranks) or by
``heads``; the sliding-window transformer shards by heads.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig, ShardStrategy
from anemo_like.models.block import GraphTransformerBlock
from anemo_like.models.edge_features import EdgeFeatures
from anemo_like.models.ops.checkpointing import run_layer_segments
from anemo_like.models.ops.chunking import DestinationChunk, SortedEdges
from anemo_like.models.ops.collectives import HaloPlan, halo_exchange, plan_halo
from anemo_like.models.ops.window_attention import Backend
from anemo_like.models.sharding import HeadSplit, ModelShard
from anemo_like.models.sliding_window import SlidingWindowTransformerLayer


class _ProcessorLayer(nn.Module):
    """A graph-transformer block on one node set (sources are destinations)."""

    def __init__(self, *, block: GraphTransformerBlock) -> None:
        super().__init__()
        self.block = block

    def forward(
        self,
        x: Tensor,
        *,
        edge_attr: Tensor,
        edges: SortedEdges,
        min_blocks: int = 1,
        halo: HaloPlan | None = None,
        heads: HeadSplit | None = None,
        shard: ModelShard | None = None,
        cond: Tensor | None = None,
        cond_src: Tensor | None = None,
        chunks: list[DestinationChunk] | None = None,
    ) -> Tensor:
        """x: (B, n, C), this rank's node block; with ``halo``, edge sources index ``cat([x, halo rows])``;
        ``cond`` / ``cond_src``: the noise conditioning of the block's rows / of the sources; ``chunks``: run a
        destination chunk at a time (one rank, no gradients: :meth:`GraphTransformerBlock.forward_in_chunks`)."""
        if chunks is not None:
            return self.block.forward_in_chunks(x, edge_attr, chunks, cond)
        x_src = x
        if halo is not None:
            x_src = torch.cat([x, halo_exchange(x, shard.group, halo.send_index, halo.recv_counts)], dim=1)
        return self.block(x_src, x, edge_attr, edges, min_blocks, heads, cond=cond, cond_src=cond_src)


class GraphTransformerProcessor(nn.Module):
    """``num_layers`` graph-transformer blocks over the hidden->hidden edges: (B, N, C) -> (B, N, C)."""

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
        shard_strategy: ShardStrategy = "edges",
        conditional: bool = False,
        block_elements: int | None = None,
    ) -> None:
        """``edge_index`` (2, E), sorted by destination, and ``edge_attr`` (E, A): the edges among ``num_nodes``;
        ``conditional``: noise-conditioned LayerNorms (ensemble models); ``block_elements``: the blocks' scratch
        blocks (None: the device's default)."""
        super().__init__()
        self.num_nodes = num_nodes
        self.num_chunks = num_chunks
        self.eval_num_chunks: int | None = None  # eval-mode destination chunks, set at setup (runtime)
        self.gradient_checkpointing = gradient_checkpointing
        self.shard_strategy = shard_strategy
        self.shard = ModelShard()
        self._halo: dict[tuple[int, int, torch.device], tuple[HaloPlan, SortedEdges, slice]] = {}
        self.edges = EdgeFeatures(
            edge_index=edge_index, edge_attr=edge_attr, trainable_size=trainable_edge_size, num_dst=num_nodes
        )
        self.layers = nn.ModuleList(
            _ProcessorLayer(
                block=GraphTransformerBlock(
                    channels=channels,
                    edge_dim=self.edges.dim,
                    num_heads=num_heads,
                    mlp_hidden_ratio=mlp_hidden_ratio,
                    bipartite=False,
                    backend=backend,
                    conditional=conditional,
                    block_elements=block_elements,
                )
            )
            for _ in range(num_layers)
        )

    @classmethod
    def from_config(
        cls, *, config: ModelConfig, graph: HeteroData, edge_type: tuple[str, str, str]
    ) -> GraphTransformerProcessor:
        """The processor over ``graph[edge_type]`` (edges within one node set), set up by ``config.processor``
        (chunk count resolved) and the model-wide ``config``."""
        if edge_type not in graph.edge_types:
            raise ValueError(
                f"the graphtransformer processor needs {edge_type[0]}->{edge_type[2]} edges, but the graph has none"
            )
        section, store = config.processor, graph[edge_type]
        return cls(
            channels=config.num_channels,
            num_nodes=graph[edge_type[2]].num_nodes,
            edge_attr=store.edge_attr,
            edge_index=store.edge_index,
            trainable_edge_size=config.trainable.edges,
            num_layers=section.num_layers,
            num_chunks=section.num_chunks,
            num_heads=config.num_heads,
            mlp_hidden_ratio=config.mlp_hidden_ratio,
            gradient_checkpointing=section.gradient_checkpointing,
            backend=config.graph_attention_backend,
            shard_strategy=section.shard_strategy,
            conditional=config.noise is not None,
            block_elements=config.resolved_block_elements,
        )

    def _halo_edges(self) -> tuple[HaloPlan, SortedEdges, slice]:
        """This rank's halo plan, its edges with sources numbered in ``cat([x_block, halo])`` and their slice of
        all edges (planned once per shard and device, collectively, at the first forward)."""
        shard = self.shard
        key = (shard.size, shard.rank, self.edges.edge_index.device)
        if key not in self._halo:
            part = self.edges.destinations(*shard.block(self.num_nodes))
            plan = plan_halo(part.edges.src, shard.bounds(self.num_nodes), shard.rank, shard.group)
            local = SortedEdges(torch.stack([plan.edge_src, part.edges.dst]), part.edges.num_dst)
            self._halo[key] = plan, local, slice(part.edge_start, part.edge_stop)
        return self._halo[key]

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        """x: (B, n, C) -> (B, n, C), this rank's block of the hidden nodes (all of them on one rank); ``cond``
        (B, n, C): the noise conditioning of those nodes (conditional processors only).

        In eval mode ``eval_num_chunks`` (when set) runs each layer a contiguous chunk of destination nodes at a time
        (keys and values once; on one rank without gradients), or, sharded, splits each layer's edges into at least
        that many destination blocks (``torch`` attention backend).
        """
        chunks = None if self.training else self.eval_num_chunks
        if chunks and chunks > 1 and self.shard.size == 1 and not torch.is_grad_enabled():
            plan, edge_attr, edges = self.edges.chunks(chunks), self.edges(), self.edges.sorted_edges()
            for layer in self.layers:
                x = layer(x, edge_attr=edge_attr, edges=edges, cond=cond, chunks=plan)
            return x
        shard, halo, heads = self.shard, None, None
        if shard.size > 1 and self.shard_strategy == "edges":
            halo, edges, edge_slice = self._halo_edges()
            edge_attr = self.edges(edge_slice)
        else:  # one rank, or heads: every edge (HeadSplit.of is None for a group of one)
            edges, edge_attr = self.edges.sorted_edges(), self.edges()
            heads = HeadSplit.of(shard, self.num_nodes, self.num_nodes)
        cond_src = cond
        if cond is not None and halo is not None:  # constant over the layers: one exchange per forward
            cond_src = torch.cat([cond, halo_exchange(cond, shard.group, halo.send_index, halo.recv_counts)], dim=1)
        return run_layer_segments(
            self.layers,
            x,
            num_segments=self.num_chunks,
            checkpointing=self.gradient_checkpointing and self.training,
            edge_attr=edge_attr,
            edges=edges,
            min_blocks=1 if self.training else self.eval_num_chunks or 1,
            halo=halo,
            heads=heads,
            shard=shard,
            cond=cond,
            cond_src=cond_src,
        )


class TransformerProcessor(nn.Module):
    """``num_layers`` sliding-window transformer layers over the node order: (B, N, C) -> (B, N, C)."""

    def __init__(
        self,
        *,
        channels: int,
        num_nodes: int,
        num_layers: int,
        num_chunks: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        window_size: int,
        attention_implementation: Backend,
        gradient_checkpointing: bool,
        conditional: bool = False,
    ) -> None:
        """``window_size``, ``attention_implementation`` and ``conditional`` (noise-conditioned norms): those of
        every ``SlidingWindowTransformerLayer``."""
        super().__init__()
        self.num_nodes = num_nodes
        self.num_chunks = num_chunks
        self.gradient_checkpointing = gradient_checkpointing
        self.shard = ModelShard()
        self.layers = nn.ModuleList(
            SlidingWindowTransformerLayer(
                channels=channels,
                num_heads=num_heads,
                mlp_hidden_ratio=mlp_hidden_ratio,
                window_size=window_size,
                attention_implementation=attention_implementation,
                conditional=conditional,
            )
            for _ in range(num_layers)
        )

    @classmethod
    def from_config(cls, *, config: ModelConfig, num_nodes: int) -> TransformerProcessor:
        """The processor of ``num_nodes`` nodes set up by ``config.processor`` (chunk count resolved) and the
        model-wide ``config``."""
        section = config.processor
        return cls(
            channels=config.num_channels,
            num_nodes=num_nodes,
            num_layers=section.num_layers,
            num_chunks=section.num_chunks,
            num_heads=config.num_heads,
            mlp_hidden_ratio=config.mlp_hidden_ratio,
            window_size=section.window_size,
            attention_implementation=section.attention_implementation,
            gradient_checkpointing=section.gradient_checkpointing,
            conditional=config.noise is not None,
        )

    def forward(self, x: Tensor, cond: Tensor | None = None) -> Tensor:
        """x: (B, n, C) -> (B, n, C), this rank's block of the hidden nodes (heads split over the model group);
        ``cond`` (B, n, C): their noise conditioning (conditional processors only)."""
        return run_layer_segments(
            self.layers,
            x,
            num_segments=self.num_chunks,
            checkpointing=self.gradient_checkpointing and self.training,
            heads=HeadSplit.of(self.shard, self.num_nodes, self.num_nodes),
            cond=cond,
        )

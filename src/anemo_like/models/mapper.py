"""Graph-transformer mapper: moves features from one node set to another over a bipartite graph.

The encoder maps data nodes to hidden (mesh) nodes, the decoder maps hidden nodes back to data nodes. Work is
split into contiguous chunks of destination nodes; because edges are sorted by destination, each chunk owns one
contiguous edge slice. A chunk embeds only the source rows it references, runs the block and writes its rows of
one preallocated output. Each chunk is checkpointed, so backward holds one chunk's edge messages at a time.

Sharded over a model group (``shard``), each rank computes its block of destination rows. ``edges`` strategy:
the rank runs the chunks of its own block's edges over the full source features (gathered first when the
sources arrive sharded). ``heads`` strategy: the rank projects its block of sources and destinations and
attends over the whole graph for its share of the heads (edges cut into ``num_chunks`` blocks, no destination
chunks).
"""

from __future__ import annotations

from torch import Tensor, nn
from torch_geometric.data import HeteroData

from anemo_like.config.schema import MapperConfig, ModelConfig, ShardStrategy
from anemo_like.models.block import GraphTransformerBlock
from anemo_like.models.edge_features import EdgeFeatures
from anemo_like.models.ops.autocast import autocast_dtype
from anemo_like.models.ops.checkpointing import maybe_checkpoint
from anemo_like.models.ops.chunking import DestinationChunk
from anemo_like.models.ops.collectives import gather_nodes
from anemo_like.models.sharding import HeadSplit, ModelShard


class GraphTransformerMapper(nn.Module):
    """Encoder (``src_in_channels`` set: sources are embedded) or decoder (``out_channels`` set: LN + Linear head).

    (B, N_src, src_in) sources and (B, N_dst, dst_in) destinations -> (B, N_dst, out_channels) destinations.
    """

    def __init__(
        self,
        *,
        src_in_channels: int | None,
        dst_in_channels: int,
        channels: int,
        out_channels: int | None,
        edge_attr: Tensor,
        edge_index: Tensor,
        num_src: int,
        num_dst: int,
        sources_sharded: bool,
        trainable_edge_size: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        num_chunks: int,
        gradient_checkpointing: bool,
        backend: str,
        shard_strategy: ShardStrategy = "edges",
        block_elements: int | None = None,
    ) -> None:
        """``edge_index`` (2, E), sorted by destination, and ``edge_attr`` (E, A) describe the ``num_src`` ->
        ``num_dst`` edges; ``sources_sharded``: sources arrive as this rank's node block (decoder), not replicated
        (encoder); ``block_elements``: the block's scratch blocks (None: the device's default)."""
        super().__init__()
        self.num_src, self.num_dst = num_src, num_dst
        self.sources_sharded = sources_sharded
        self.shard_strategy = shard_strategy
        self.shard = ModelShard()
        self.num_chunks = num_chunks
        self.eval_num_chunks: int | None = None  # eval-mode override, set at setup (runtime.inference_environment)
        self.gradient_checkpointing = gradient_checkpointing
        self.edges = EdgeFeatures(
            edge_index=edge_index, edge_attr=edge_attr, trainable_size=trainable_edge_size, num_dst=num_dst
        )
        self.embed_src = nn.Linear(src_in_channels, channels) if src_in_channels is not None else nn.Identity()
        self.embed_dst = nn.Linear(dst_in_channels, channels)
        self.block = GraphTransformerBlock(
            channels=channels,
            edge_dim=self.edges.dim,
            num_heads=num_heads,
            mlp_hidden_ratio=mlp_hidden_ratio,
            bipartite=True,
            backend=backend,
            block_elements=block_elements,
        )
        self.head = (
            nn.Sequential(nn.LayerNorm(channels), nn.Linear(channels, out_channels))
            if out_channels is not None
            else nn.Identity()
        )
        self.out_channels = out_channels or channels

    @classmethod
    def from_config(
        cls,
        *,
        config: ModelConfig,
        section: MapperConfig,
        graph: HeteroData,
        edge_type: tuple[str, str, str],
        dst_in_channels: int,
        sources_sharded: bool,
        src_in_channels: int | None = None,
        out_channels: int | None = None,
    ) -> GraphTransformerMapper:
        """The mapper over ``graph[edge_type]``: chunking, checkpointing and sharding from ``section``
        (``config.encoder`` or ``config.decoder``, chunk count resolved), widths, heads, trainable edge features
        and attention backend from the model-wide ``config``."""
        store = graph[edge_type]
        return cls(
            src_in_channels=src_in_channels,
            dst_in_channels=dst_in_channels,
            channels=config.num_channels,
            out_channels=out_channels,
            edge_attr=store.edge_attr,
            edge_index=store.edge_index,
            num_src=graph[edge_type[0]].num_nodes,
            num_dst=graph[edge_type[2]].num_nodes,
            sources_sharded=sources_sharded,
            trainable_edge_size=config.trainable.edges,
            num_heads=config.num_heads,
            mlp_hidden_ratio=config.mlp_hidden_ratio,
            num_chunks=section.num_chunks,
            gradient_checkpointing=section.gradient_checkpointing,
            backend=config.graph_attention_backend,
            shard_strategy=section.shard_strategy,
            block_elements=config.resolved_block_elements,
        )

    def _run_chunk(self, x_src: Tensor, x_dst: Tensor, chunk: DestinationChunk, edge_offset: int) -> Tensor:
        """One destination chunk: (B, N_src, src_in), (B, n_dst, dst_in) -> (B, chunk rows, out_channels)."""
        src = self.embed_src(x_src.index_select(1, chunk.src_index))
        dst = self.embed_dst(x_dst[:, chunk.dst_start : chunk.dst_stop])
        edge_attr = self.edges(slice(edge_offset + chunk.edge_start, edge_offset + chunk.edge_stop))
        return self.head(self.block(src, dst, edge_attr, chunk.edges))

    def _run_heads(self, x_src: Tensor, x_dst: Tensor, min_blocks: int) -> Tensor:
        """Head-sharded: this rank's (B, n_src, src_in) and (B, n_dst, dst_in) blocks -> (B, n_dst, out_channels)."""
        heads = HeadSplit.of(self.shard, self.num_src, self.num_dst)
        block = self.block(
            self.embed_src(x_src), self.embed_dst(x_dst), self.edges(), self.edges.sorted_edges(), min_blocks, heads
        )
        return self.head(block)

    def forward(self, x_src: Tensor, x_dst: Tensor) -> Tensor:
        """x_src: (B, N_src, src_in) (or this rank's block of it when ``sources_sharded``), x_dst: (B, n_dst, dst_in)
        this rank's destination block -> (B, n_dst, out_channels).

        In eval mode ``eval_num_chunks`` (when set) overrides the configured chunk count.
        """
        checkpointing = self.gradient_checkpointing and self.training
        num_chunks = self.num_chunks if self.training else self.eval_num_chunks or self.num_chunks
        shard = self.shard
        if self.shard_strategy == "heads" and shard.size > 1:
            if not self.sources_sharded:
                x_src = x_src[:, slice(*shard.block(self.num_src))]
            return maybe_checkpoint(checkpointing, self._run_heads, x_src, x_dst, num_chunks)
        if self.sources_sharded:
            x_src = gather_nodes(x_src, shard.group, shard.sizes(self.num_src))
        part = self.edges.destinations(*shard.block(self.num_dst))
        rows = (x_dst.shape[0], part.dst_stop - part.dst_start, self.out_channels)
        out = x_dst.new_empty(rows, dtype=autocast_dtype(x_dst))  # the chunks' dtype: a Linear layer's output
        for chunk in self.edges.chunks(num_chunks, part):
            out[:, chunk.dst_start : chunk.dst_stop] = maybe_checkpoint(
                checkpointing, self._run_chunk, x_src, x_dst, chunk, part.edge_start
            )
        return out

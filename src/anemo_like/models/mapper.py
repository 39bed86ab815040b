"""Graph-transformer mapper: moves features from one node set to another over a bipartite graph.

The encoder maps data nodes to hidden (mesh) nodes, the decoder maps hidden nodes back to data nodes. Work is
split into contiguous chunks of destination nodes; because edges are sorted by destination, each chunk owns one
contiguous edge slice. A chunk embeds only the source rows it references, runs the block and writes its rows of
one preallocated output. Each chunk is checkpointed, so backward holds one chunk's edge messages at a time.
"""

from __future__ import annotations

from torch import Tensor, nn

from anemo_like.models.block import GraphTransformerBlock
from anemo_like.models.checkpointing import maybe_checkpoint
from anemo_like.models.chunking import DestinationChunk
from anemo_like.models.edge_features import EdgeFeatures
from anemo_like.models.inference_chunks import inference_num_chunks


class GraphTransformerMapper(nn.Module):
    """Encoder (``src_in_channels`` set: sources are embedded) or decoder (``out_channels`` set: LN + Linear head)."""

    def __init__(
        self,
        *,
        src_in_channels: int | None,
        dst_in_channels: int,
        channels: int,
        out_channels: int | None,
        edge_attr: Tensor,
        edge_index: Tensor,
        num_dst: int,
        trainable_edge_size: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        num_chunks: int,
        gradient_checkpointing: bool,
        backend: str,
    ) -> None:
        super().__init__()
        self.num_dst = num_dst
        self.num_chunks = num_chunks
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
        )
        self.head = (
            nn.Sequential(nn.LayerNorm(channels), nn.Linear(channels, out_channels))
            if out_channels is not None
            else nn.Identity()
        )
        self.out_channels = out_channels or channels

    def _run_chunk(self, x_src: Tensor, x_dst: Tensor, chunk: DestinationChunk) -> Tensor:
        src = self.embed_src(x_src.index_select(1, chunk.src_index))
        dst = self.embed_dst(x_dst[:, chunk.dst_start : chunk.dst_stop])
        edge_attr = self.edges(slice(chunk.edge_start, chunk.edge_stop))
        return self.head(self.block(src, dst, edge_attr, chunk.edges))

    def forward(self, x_src: Tensor, x_dst: Tensor) -> Tensor:
        """x_src: (B, N_src, src_in), x_dst: (B, N_dst, dst_in) -> (B, N_dst, out_channels).

        In eval mode ``ANEMOI_INFERENCE_NUM_CHUNKS[_MAPPER]`` overrides the configured chunk count.
        """
        out = x_dst.new_empty(x_dst.shape[0], self.num_dst, self.out_channels)
        checkpointing = self.gradient_checkpointing and self.training
        num_chunks = self.num_chunks if self.training else inference_num_chunks("MAPPER") or self.num_chunks
        for chunk in self.edges.chunks(num_chunks):
            out[:, chunk.dst_start : chunk.dst_stop] = maybe_checkpoint(
                checkpointing, self._run_chunk, x_src, x_dst, chunk
            )
        return out

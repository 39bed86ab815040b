"""Graph-transformer block: pre-LayerNorm edge attention plus a pre-LayerNorm MLP, both residual."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from anemo_like.models.mlp import MLP
from anemo_like.models.noise import apply_norm, layer_norm
from anemo_like.models.ops.chunking import DestinationChunk, SortedEdges
from anemo_like.models.ops.graph_attention import GRAPH_ATTENTION_BACKENDS
from anemo_like.models.sharding import HeadSplit


class GraphTransformerBlock(nn.Module):
    """Updates destination nodes from their incoming edges.

    ``bipartite=True`` (mappers) normalises source and destination with separate LayerNorms; otherwise
    (processor) source and destination are the same node set and share one.
    """

    def __init__(
        self,
        *,
        channels: int,
        edge_dim: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        bipartite: bool,
        backend: str,
        conditional: bool = False,
        block_elements: int | None = None,
    ) -> None:
        """``edge_dim``: features per edge; ``backend``: a key of ``GRAPH_ATTENTION_BACKENDS``; ``conditional``:
        noise-conditioned LayerNorms (processor of an ensemble model, :mod:`anemo_like.models.noise`);
        ``block_elements``: the attention's and the MLP's scratch blocks (``model.block_elements``, None: auto)."""
        super().__init__()
        self.num_heads = num_heads
        self.block_elements = block_elements
        self.attention = GRAPH_ATTENTION_BACKENDS[backend]
        self.norm_dst = layer_norm(channels, conditional=conditional)
        self.norm_src = nn.LayerNorm(channels) if bipartite else None
        self.lin_query = nn.Linear(channels, channels)
        self.lin_key = nn.Linear(channels, channels)
        self.lin_value = nn.Linear(channels, channels)
        self.lin_self = nn.Linear(channels, channels)
        self.lin_edge = nn.Linear(edge_dim, channels)
        self.projection = nn.Linear(channels, channels)
        hidden = int(channels * mlp_hidden_ratio + 0.5)
        self.norm_mlp = layer_norm(channels, conditional=conditional)
        self.mlp = MLP(channels=channels, hidden=hidden, block_elements=block_elements)

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.num_heads, -1))

    def forward(
        self,
        x_src: Tensor,
        x_dst: Tensor,
        edge_attr: Tensor,
        edges: SortedEdges,
        min_blocks: int = 1,
        heads: HeadSplit | None = None,
        cond: Tensor | None = None,
        cond_src: Tensor | None = None,
    ) -> Tensor:
        """x_src: (B, N_src, C), x_dst: (B, N_dst, C), edge_attr: (E, edge_dim) -> (B, N_dst, C).

        ``min_blocks`` asks the attention backend to split the edges into at least that many blocks. With
        ``heads``, the rows are this rank's node blocks and attention runs over the whole graph (``edges``) for
        this rank's share of the heads. A processor passes ``x_src is x_dst``, or ``x_dst`` followed by halo rows.
        With conditional norms, ``cond`` (B, N_dst, C) and ``cond_src`` (B, N_src, C) condition them.
        """
        h_dst = apply_norm(self.norm_dst, x_dst, cond)
        h_src = h_dst if x_src is x_dst else apply_norm(self.norm_src or self.norm_dst, x_src, cond_src)
        q = self._heads(self.lin_query(h_dst))
        k, v = self._heads(self.lin_key(h_src)), self._heads(self.lin_value(h_src))
        weight, bias = self.lin_edge.weight, self.lin_edge.bias
        if heads is not None:  # one all-to-all for keys and values together
            q = heads.to_heads(q, source=False)
            k, v = heads.to_heads(torch.cat([k, v], dim=-1), source=True).chunk(2, dim=-1)
            rows = heads.head_rows(self.num_heads, q.shape[-1])
            weight, bias = weight[rows], bias[rows]
        attended = self.attention(
            q, k, v, edge_attr, weight, bias, edges, min_blocks=min_blocks, block_elements=self.block_elements
        )
        if heads is not None:
            attended = heads.to_nodes(attended)
        out = x_dst + self.projection(attended.flatten(-2) + self.lin_self(h_dst))
        return out + self.mlp(apply_norm(self.norm_mlp, out, cond))

    def forward_in_chunks(
        self, x: Tensor, edge_attr: Tensor, chunks: list[DestinationChunk], cond: Tensor | None = None
    ) -> Tensor:
        """:meth:`forward` over one node set (a processor layer) without gradients, a destination chunk at a time:
        keys and values of every node once, then each chunk's queries, attention, projections and MLP. Holds four
        node-sized tensors (input, keys, values, output) besides one chunk's, instead of about a dozen.

        x: (B, N, C), edge_attr: (E, edge_dim) of the edges the chunks cut, ``cond`` (B, N, C) -> (B, N, C)."""
        h = apply_norm(self.norm_dst, x, cond)
        k, v = self._heads(self.lin_key(h)), self._heads(self.lin_value(h))
        del h
        out = torch.empty_like(x)
        weight, bias = self.lin_edge.weight, self.lin_edge.bias
        for chunk in chunks:
            rows = slice(chunk.dst_start, chunk.dst_stop)
            x_rows, cond_rows = x[:, rows], None if cond is None else cond[:, rows]
            h_rows = apply_norm(self.norm_dst, x_rows, cond_rows)
            attended = self.attention(
                self._heads(self.lin_query(h_rows)),
                k.index_select(1, chunk.src_index),
                v.index_select(1, chunk.src_index),
                edge_attr[chunk.edge_start : chunk.edge_stop],
                weight,
                bias,
                chunk.edges,
                block_elements=self.block_elements,
            )
            updated = x_rows + self.projection(attended.flatten(-2) + self.lin_self(h_rows))
            out[:, rows] = updated + self.mlp(apply_norm(self.norm_mlp, updated, cond_rows))
        return out

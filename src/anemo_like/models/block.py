"""Graph-transformer block: pre-LayerNorm edge attention plus a pre-LayerNorm MLP, both residual."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from anemo_like.models.chunking import DestinationChunk
from anemo_like.models.graph_attention import GRAPH_ATTENTION_BACKENDS


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
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.attention = GRAPH_ATTENTION_BACKENDS[backend]
        self.norm_dst = nn.LayerNorm(channels)
        self.norm_src = nn.LayerNorm(channels) if bipartite else None
        self.lin_query = nn.Linear(channels, channels)
        self.lin_key = nn.Linear(channels, channels)
        self.lin_value = nn.Linear(channels, channels)
        self.lin_self = nn.Linear(channels, channels)
        self.lin_edge = nn.Linear(edge_dim, channels)
        self.projection = nn.Linear(channels, channels)
        hidden = int(channels * mlp_hidden_ratio + 0.5)
        self.norm_mlp = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels))

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.num_heads, -1))

    def forward(
        self,
        x_src: Tensor,
        x_dst: Tensor,
        edge_attr: Tensor,
        edge_index: Tensor,
        chunks: Sequence[DestinationChunk] | None = None,
    ) -> Tensor:
        """x_src: (B, N_src, C), x_dst: (B, N_dst, C), edge_attr: (E, edge_dim), edge_index: (2, E) -> (B, N_dst, C).

        With ``chunks`` (destination-sorted edges), attention and the edge embedding run one destination chunk at
        a time, so only one chunk's edge tensors exist at once.
        """
        h_dst = self.norm_dst(x_dst)
        h_src = h_dst if self.norm_src is None else self.norm_src(x_src)
        q = self._heads(self.lin_query(h_dst))
        k = self._heads(self.lin_key(h_src))
        v = self._heads(self.lin_value(h_src))
        if chunks is None:
            attended = self.attention(q, k, v, self._heads(self.lin_edge(edge_attr)), edge_index)
        else:
            attended = torch.cat(
                [
                    self.attention(
                        q[:, c.dst_start : c.dst_stop],
                        k.index_select(1, c.src_index),
                        v.index_select(1, c.src_index),
                        self._heads(self.lin_edge(edge_attr[c.edge_start : c.edge_stop])),
                        c.edge_index,
                    )
                    for c in chunks
                ],
                dim=1,
            )
        attended = attended.flatten(-2)
        out = x_dst + self.projection(attended + self.lin_self(h_dst))
        return out + self.mlp(self.norm_mlp(out))

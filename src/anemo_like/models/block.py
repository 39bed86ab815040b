"""Graph-transformer block: pre-LayerNorm edge attention plus a pre-LayerNorm MLP, both residual."""

from __future__ import annotations

from torch import Tensor, nn

from anemo_like.models.chunking import SortedEdges
from anemo_like.models.graph_attention import GRAPH_ATTENTION_BACKENDS
from anemo_like.models.mlp import MLP


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
        self.mlp = MLP(channels, hidden)

    def _heads(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.num_heads, -1))

    def forward(
        self, x_src: Tensor, x_dst: Tensor, edge_attr: Tensor, edges: SortedEdges, min_blocks: int = 1
    ) -> Tensor:
        """x_src: (B, N_src, C), x_dst: (B, N_dst, C), edge_attr: (E, edge_dim) -> (B, N_dst, C).

        ``min_blocks`` asks the attention backend to split the edges into at least that many blocks.
        """
        h_dst = self.norm_dst(x_dst)
        h_src = h_dst if self.norm_src is None else self.norm_src(x_src)
        q = self._heads(self.lin_query(h_dst))
        k = self._heads(self.lin_key(h_src))
        v = self._heads(self.lin_value(h_src))
        attended = self.attention(
            q, k, v, edge_attr, self.lin_edge.weight, self.lin_edge.bias, edges, min_blocks=min_blocks
        ).flatten(-2)
        out = x_dst + self.projection(attended + self.lin_self(h_dst))
        return out + self.mlp(self.norm_mlp(out))

"""The sliding-window transformer layer: attention over node index order (backends in ``window_attention``)."""

from __future__ import annotations

from torch import Tensor, nn

from anemo_like.models.noise import apply_norm, layer_norm
from anemo_like.models.ops.window_attention import Backend, window_attention
from anemo_like.models.sharding import HeadSplit


class SlidingWindowTransformerLayer(nn.Module):
    """Pre-LayerNorm multi-head sliding-window self-attention and MLP, both residual."""

    def __init__(
        self,
        *,
        channels: int,
        num_heads: int,
        mlp_hidden_ratio: float,
        window_size: int,
        attention_implementation: Backend = "scaled_dot_product_attention",
        conditional: bool = False,
    ) -> None:
        """Each node attends to the nodes at most ``window_size`` places away in index order; ``conditional``:
        noise-conditioned LayerNorms (:mod:`anemo_like.models.noise`)."""
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        self.attention_implementation = attention_implementation
        self.eval_backend: Backend | None = None  # eval-mode override, set at setup (runtime.inference_environment)
        self.norm_attention = layer_norm(channels, conditional=conditional)
        self.qkv = nn.Linear(channels, 3 * channels, bias=False)
        self.projection = nn.Linear(channels, channels)
        hidden = int(channels * mlp_hidden_ratio + 0.5)
        self.norm_mlp = layer_norm(channels, conditional=conditional)
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels))

    def forward(self, x: Tensor, heads: HeadSplit | None = None, cond: Tensor | None = None) -> Tensor:
        """x: (B, N, C) -> (B, N, C); with ``heads``, x is this rank's node block and attention runs over all nodes
        for this rank's share of the heads; ``cond`` (B, N, C) conditions the norms of a conditional layer."""
        normed = apply_norm(self.norm_attention, x, cond)
        qkv = self.qkv(normed).unflatten(-1, (3, self.num_heads, -1)).transpose(2, 3)  # B,N,H,3,C
        if heads is not None:
            qkv = heads.to_heads(qkv.flatten(-2), source=True).unflatten(-1, (3, -1))  # (B, N, H / P, 3, C)
        q, k, v = qkv.permute(3, 0, 2, 1, 4)  # each (B, H, N, C)
        backend = self.attention_implementation if self.training else self.eval_backend or self.attention_implementation
        attended = window_attention(q, k, v, window=self.window_size, backend=backend).transpose(1, 2)
        if heads is not None:
            attended = heads.to_nodes(attended)
        x = x + self.projection(attended.flatten(-2))
        return x + self.mlp(apply_norm(self.norm_mlp, x, cond))

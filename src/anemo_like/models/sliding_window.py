"""Sliding-window self-attention over node index order, computed band by band (memory O(N * window))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def sliding_window_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int) -> Tensor:
    """Each query i attends to keys j with |i - j| <= window.

    q, k, v: (B, H, N, C) -> (B, H, N, C). Queries are processed in blocks; each block sees only its key band,
    so no (N, N) mask or score matrix is ever built.
    """
    n = q.shape[-2]
    if window >= n - 1:  # every key is within the window of every query
        return F.scaled_dot_product_attention(q, k, v)
    block = max(32, window // 2)
    outputs = []
    for start in range(0, n, block):
        stop = min(start + block, n)
        key_start, key_stop = max(0, start - window), min(n, stop + window)
        rows = torch.arange(start, stop, device=q.device).unsqueeze(1)
        cols = torch.arange(key_start, key_stop, device=q.device).unsqueeze(0)
        mask = (rows - cols).abs() <= window
        outputs.append(
            F.scaled_dot_product_attention(
                q[..., start:stop, :], k[..., key_start:key_stop, :], v[..., key_start:key_stop, :], attn_mask=mask
            )
        )
    return torch.cat(outputs, dim=-2)


class SlidingWindowTransformerLayer(nn.Module):
    """Pre-LayerNorm multi-head sliding-window self-attention and MLP, both residual."""

    def __init__(self, *, channels: int, num_heads: int, mlp_hidden_ratio: float, window_size: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.window_size = window_size
        self.norm_attention = nn.LayerNorm(channels)
        self.qkv = nn.Linear(channels, 3 * channels, bias=False)
        self.projection = nn.Linear(channels, channels)
        hidden = int(channels * mlp_hidden_ratio + 0.5)
        self.norm_mlp = nn.LayerNorm(channels)
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(), nn.Linear(hidden, channels))

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, N, C) -> (B, N, C)."""
        q, k, v = self.qkv(self.norm_attention(x)).unflatten(-1, (3, self.num_heads, -1)).permute(2, 0, 3, 1, 4)
        attended = sliding_window_attention(q, k, v, window=self.window_size)
        x = x + self.projection(attended.transpose(1, 2).flatten(-2))
        return x + self.mlp(self.norm_mlp(x))

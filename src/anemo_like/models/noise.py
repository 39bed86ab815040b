"""Processor noise of an ensemble model: noise-conditioned LayerNorms.

Each forward pass draws ``channels`` standard normal values per mesh node (``z``: (B, N, D)); an MLP embeds them
into a conditioning vector per node (B, N, C), and every processor LayerNorm scales and shifts its output by a
linear map of it: ``LN(x) * (1 + scale(c)) + shift(c)``. The maps start at zero, so an untrained stochastic model
is the deterministic one, and training (with a CRPS loss) learns how much spread each layer adds.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class NoiseEmbedding(nn.Module):
    """(B, N, D) standard normal noise -> (B, N, C) conditioning."""

    def __init__(self, *, noise_channels: int, channels: int) -> None:
        super().__init__()
        self.noise_channels = noise_channels
        self.mlp = nn.Sequential(nn.Linear(noise_channels, channels), nn.SiLU(), nn.Linear(channels, channels))

    def forward(self, noise: Tensor) -> Tensor:
        return self.mlp(noise)


class ConditionalLayerNorm(nn.LayerNorm):
    """LayerNorm whose output is scaled and shifted per node by the noise conditioning (zero-initialised). Its
    own weight and bias keep the LayerNorm's names, so a deterministic model's weights warm-start it."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)
        self.modulation = nn.Linear(channels, 2 * channels)
        nn.init.zeros_(self.modulation.weight)
        nn.init.zeros_(self.modulation.bias)

    def forward(self, x: Tensor, cond: Tensor) -> Tensor:  # type: ignore[override]
        """x, cond: (B, N, C) -> (B, N, C)."""
        scale, shift = self.modulation(cond).chunk(2, dim=-1)
        return super().forward(x) * (1 + scale) + shift


def layer_norm(channels: int, *, conditional: bool) -> nn.LayerNorm | ConditionalLayerNorm:
    """A plain LayerNorm, or a noise-conditioned one."""
    return ConditionalLayerNorm(channels) if conditional else nn.LayerNorm(channels)


def apply_norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> Tensor:
    """``norm(x)``, conditioned on ``cond`` when ``norm`` is a :class:`ConditionalLayerNorm`."""
    return norm(x, cond) if isinstance(norm, ConditionalLayerNorm) else norm(x)


def draw_noise(
    generator: torch.Generator | None, *, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype
) -> Tensor:
    """Standard normal noise of ``shape`` from ``generator`` (None: torch's global generator), drawn on its
    device (the generator's device must be ``device``)."""
    return torch.randn(shape, generator=generator, device=device, dtype=dtype)

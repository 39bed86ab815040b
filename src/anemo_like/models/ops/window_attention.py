"""Sliding-window attention backends of the transformer processor, and the choice among them at run time.

``model.processor.attention_implementation`` names the backend; in eval mode a layer's ``eval_backend`` (set at
setup from ``ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND`` by :mod:`anemo_like.runtime.inference_environment`)
overrides it. A backend that cannot run here falls back to ``scaled_dot_product_attention`` with one log line
saying why.

- ``flash_attention``: flash-attn (v3 ``flash_attn_interface`` or v2 ``flash_attn``) on a CUDA device, fp16/bf16.
- ``scaled_dot_product_attention``: torch SDPA over key bands, memory O(N * window) (any device, any dtype).
- ``reference``: plain softmax attention with a dense (N, N) mask, for checking the others on small inputs.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

LOG = logging.getLogger(__name__)
Backend = Literal["flash_attention", "scaled_dot_product_attention", "reference"]
BACKENDS: tuple[Backend, ...] = ("flash_attention", "scaled_dot_product_attention", "reference")
FlashFunction = Callable[..., Tensor | tuple[Tensor, ...]]
_reported: set[tuple[str, str]] = set()  # (requested, reason) fallbacks already logged


def band_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int) -> Tensor:
    """SDPA: each query i attends to keys j with |i - j| <= window. q, k, v: (B, H, N, C) -> (B, H, N, C).

    Queries are processed in blocks; each block sees only its key band, so no (N, N) mask is ever built.
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


def reference_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int) -> Tensor:
    """The same as :func:`band_attention` by the textbook formula, in fp32 or wider: (B, H, N, C) -> (B, H, N, C)."""
    n = q.shape[-2]
    index = torch.arange(n, device=q.device)
    allowed = (index[:, None] - index[None, :]).abs() <= window
    wide = torch.promote_types(q.dtype, torch.float32)
    scores = (q.to(wide) @ k.to(wide).transpose(-1, -2)) / q.shape[-1] ** 0.5
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return (weights @ v.to(wide)).to(q.dtype)


def flash_attention(q: Tensor, k: Tensor, v: Tensor, *, window: int, flash: FlashFunction) -> Tensor:
    """flash-attn's ``flash_attn_func`` on (B, H, N, C) tensors -> (B, H, N, C).

    flash-attn takes (B, N, H, C) and ``window_size=(left, right)``: query i sees keys i - left .. i + right.
    """
    result = flash(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        softmax_scale=q.shape[-1] ** -0.5,
        causal=False,
        window_size=(window, window),
    )
    out = result[0] if isinstance(result, tuple) else result  # some flash-attn 3 releases also return the LSE
    return out.transpose(1, 2)


@functools.cache
def import_flash_attention() -> FlashFunction | None:
    """``flash_attn_func`` of flash-attn 3 (``flash_attn_interface``) or 2 (``flash_attn``), None if neither.

    Looked up once per process: a failed import is not cached by Python, and this runs at every forward.
    """
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError:
        try:
            from flash_attn import flash_attn_func
        except ImportError:
            return None
    return flash_attn_func


def flash_unavailable_reason(device: torch.device, dtype: torch.dtype, flash: FlashFunction | None) -> str | None:
    """Why flash-attn cannot run on these inputs, or None when it can."""
    if flash is None:
        return "flash-attn is not installed (pip install flash-attn on a CUDA machine)"
    if device.type != "cuda":
        return f"flash-attn needs a CUDA device, the inputs are on {device.type}"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn needs fp16 or bf16 inputs, they are {dtype}"
    return None


def window_attention(
    q: Tensor, k: Tensor, v: Tensor, *, window: int, backend: Backend, flash: FlashFunction | None = None
) -> Tensor:
    """Sliding-window attention by ``backend``; flash-attn falls back to SDPA (one log line) where it cannot run.

    q, k, v: (B, H, N, C) -> (B, H, N, C). ``flash`` defaults to the installed flash-attn.
    """
    if backend == "reference":
        return reference_attention(q, k, v, window=window)
    if backend == "flash_attention":
        flash = flash or import_flash_attention()
        reason = flash_unavailable_reason(q.device, q.dtype, flash)
        if reason is None:
            return flash_attention(q, k, v, window=window, flash=flash)
        if (backend, reason) not in _reported:
            _reported.add((backend, reason))
            LOG.warning(
                "attention backend flash_attention cannot run here: %s; using scaled_dot_product_attention", reason
            )
    return band_attention(q, k, v, window=window)

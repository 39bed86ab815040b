"""Can the configured attention backends run on this device? Checked once at setup.

A backend that cannot run falls back at run time with one log line (``graph_attention`` for ``triton``,
``window_attention`` for ``flash_attention``); the config keeps naming it, so a checkpoint trained on a laptop
still asks for the fast backend on a GPU. With ``model.strict_backends: true`` the fallback is an error instead.
"""

from __future__ import annotations

import torch

from anemo_like.config.schema import ModelConfig
from anemo_like.models.ops.triton_graph_attention import triton_unavailable_reason
from anemo_like.models.ops.window_attention import flash_unavailable_reason, import_flash_attention


def unavailable_backends(model: ModelConfig, device: torch.device, dtype: torch.dtype) -> list[str]:
    """``"key=value: reason"`` for every configured backend that cannot run on ``device`` in ``dtype``."""
    problems = []
    if model.graph_attention_backend == "triton":
        reason = triton_unavailable_reason(device)
        if reason is not None:
            problems.append(f"model.graph_attention_backend=triton: {reason}")
    processor = model.processor
    if processor.type == "transformer" and processor.attention_implementation == "flash_attention":
        reason = flash_unavailable_reason(device, dtype, import_flash_attention())
        if reason is not None:
            problems.append(f"model.processor.attention_implementation=flash_attention: {reason}")
    return problems


def check_backends(model: ModelConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
    """Raise when ``model.strict_backends`` is set and a configured backend cannot run here."""
    problems = unavailable_backends(model, device, dtype)
    if problems and model.strict_backends:
        raise ValueError(
            "model.strict_backends is true and "
            + "; ".join(problems)
            + " (set model.strict_backends=false to fall back with a log line)"
        )

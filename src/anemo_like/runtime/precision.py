"""``training.precision``: the dtype of weights and activations, autocast, and the gradient scaler."""

from __future__ import annotations

import contextlib
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch
from torch import nn

from anemo_like.config.schema import Precision
from anemo_like.runtime.weight_casts import linear_weights_cast_once

LOG = logging.getLogger(__name__)

_AUTOCAST = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}


@dataclass
class PrecisionPlan:
    """How a run computes: weights in ``param_dtype``; the forward under autocast to ``autocast_dtype`` (None: no
    autocast); losses scaled by ``scaler`` (16-mixed only, against fp16 gradient underflow)."""

    device: torch.device
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None
    scaler: torch.amp.GradScaler | None
    cache_casts: bool = True  # autocast's cache of low-precision weight copies (off under CUDA graph capture)
    cast_weights_once: bool = True  # linear weights cast once per training step (off under torch.compile)

    def autocast(self) -> AbstractContextManager:
        """Context for the forward pass and loss (a no-op without autocast)."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, cache_enabled=self.cache_casts)

    def training_weights(self, model: nn.Module) -> AbstractContextManager:
        """Context for a training step's forward and backward: under autocast, the linear weights of ``model`` cast
        once for the step (``weight_casts.py``); else a no-op."""
        if self.autocast_dtype is None or not self.cast_weights_once:
            return contextlib.nullcontext()
        return linear_weights_cast_once(model, self.autocast_dtype)


def precision_plan(
    name: Precision, device: torch.device, *, cuda_graphs: bool = False, compiled: bool = False
) -> PrecisionPlan:
    """The plan for ``training.precision=name`` on ``device`` (``cuda_graphs``: the step will be captured, which
    autocast's weight-cast cache does not survive; ``compiled``: modules run under torch.compile, whose guards on
    the parameters a per-step weight copy would fail); ``tf32`` also sets the process's fp32 matmul
    precision to "high" (TF32 tensor cores on NVIDIA GPUs since Ampere; no effect on most CPUs)."""
    if name == "tf32":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    autocast_dtype = _AUTOCAST.get(name)
    if autocast_dtype is not None and not torch.amp.is_autocast_available(device.type):
        raise ValueError(f"training.precision={name}: autocast is not available on device type {device.type}")
    scaler = torch.amp.GradScaler(device.type) if name == "16-mixed" else None
    param_dtype = torch.bfloat16 if name == "bf16" else torch.float32
    if name != "32":
        LOG.info(
            "precision %s: weights %s, activations %s%s",
            name,
            str(param_dtype).removeprefix("torch."),
            str(autocast_dtype or param_dtype).removeprefix("torch.") + (" (autocast)" if autocast_dtype else ""),
            ", gradient scaler" if scaler else "",
        )
    return PrecisionPlan(
        device, param_dtype, autocast_dtype, scaler, cache_casts=not cuda_graphs, cast_weights_once=not compiled
    )

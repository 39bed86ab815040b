"""The AdamW optimiser: fused kernels where the device supports them, else the multi-tensor (foreach) path."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import Tensor, nn

from anemo_like.config.schema import OptimizerConfig

LOG = logging.getLogger(__name__)


def build_adamw(
    parameters: Iterable[nn.Parameter], config: OptimizerConfig, *, capturable: bool = False
) -> torch.optim.AdamW:
    """AdamW with ``config``'s settings; ``capturable``: state and learning rate on the device, for CUDA graphs
    (the learning rate is then a tensor, updated in place)."""
    parameters = list(parameters)
    lr: float | torch.Tensor = config.lr
    if capturable:
        lr = torch.tensor(config.lr, device=parameters[0].device)
    common = {"lr": lr, "betas": config.betas, "weight_decay": config.weight_decay, "capturable": capturable}
    if config.fused:
        try:
            return torch.optim.AdamW(parameters, fused=True, **common)
        except (RuntimeError, ValueError) as error:
            LOG.info("training.optimizer.fused: fused AdamW unavailable here (%s); using foreach AdamW", error)
    return torch.optim.AdamW(parameters, foreach=True, **common)


def set_learning_rate(optimizer: torch.optim.Optimizer, value: float) -> None:
    """Set every group's learning rate without a host-device sync (in place when it is a tensor)."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value


def step_unless(optimizer: torch.optim.Optimizer, skip: Tensor) -> None:
    """``optimizer.step()`` unless ``skip`` (a 0-dim bool tensor) is set. Fused AdamW decides on the device (no
    host-device sync, and a CUDA graph can capture it); the foreach fallback reads ``skip`` on the host."""
    if optimizer.defaults.get("fused"):
        optimizer.found_inf = skip.to(torch.float32)  # the fused kernel leaves weights and state untouched if set
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not bool(skip):
        optimizer.step()

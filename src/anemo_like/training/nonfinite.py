"""Diverging runs stop: a step whose loss or gradient norm is not finite is skipped, and
``training.max_nonfinite_steps`` such steps in a row stop training with an error naming the step.

The count lives on the device (no host-device sync per step, and it can be captured in a CUDA graph); the trainer
reads it when it logs the loss. The weights are checked once more before every checkpoint write, so a checkpoint
never holds non-finite values.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


class TrainingDiverged(RuntimeError):
    """Training stopped: non-finite losses, gradients or weights."""


class NonFiniteSteps:
    """Consecutive non-finite steps, counted on ``device``; ``record`` is free of host syncs."""

    def __init__(self, device: torch.device, *, limit: int) -> None:
        self.limit = limit
        self.streak = torch.zeros((), dtype=torch.int64, device=device)  # non-finite steps in a row
        self.seen = torch.zeros((), dtype=torch.int64, device=device)  # steps recorded
        self.reached_at = torch.zeros((), dtype=torch.int64, device=device)  # ``seen`` when streak hit the limit

    def record(self, bad: Tensor) -> None:
        """Count one step; ``bad`` is a 0-dim bool tensor (the step was not finite)."""
        self.seen.add_(1)
        self.streak.add_(1).mul_(bad)
        hit = (self.streak >= self.limit) & (self.reached_at == 0)
        self.reached_at.copy_(torch.where(hit, self.seen, self.reached_at))

    def reached(self) -> int | None:
        """How many recorded steps in the limit was first reached (1 = the first recorded step); None if not yet.
        Reads the device."""
        value = int(self.reached_at)
        return value or None


def step_is_finite(loss: Tensor, grad_norm: Tensor | None) -> Tensor:
    """0-dim bool tensor: the loss and (when given) the gradient norm are finite."""
    finite = torch.isfinite(loss)
    return finite if grad_norm is None else finite & torch.isfinite(grad_norm)


def gradient_norm(parameters: Iterable[nn.Parameter]) -> Tensor:
    """The 2-norm of all gradients (0-dim, on their device)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads, foreach=True)

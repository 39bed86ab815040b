"""Step-indexed schedules (pure functions of the step, so a resumed run continues exactly)."""

from __future__ import annotations

import math

from anemo_like.config.schema import OptimizerConfig, RolloutConfig


def learning_rate(step: int, *, config: OptimizerConfig, max_steps: int) -> float:
    """Linear warm-up from 0 to ``lr`` over ``warmup_steps``, then cosine decay to ``lr_min`` at ``max_steps``."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.lr_min + 0.5 * (config.lr - config.lr_min) * (1 + math.cos(math.pi * progress))


def learning_rate_scale(rule: str, instances: int) -> float:
    """Factor on ``lr`` and ``lr_min`` for ``instances`` data-parallel model instances: none, linear or sqrt."""
    return {"none": 1.0, "linear": float(instances), "sqrt": math.sqrt(instances)}[rule]


def rollout_steps(step: int, *, config: RolloutConfig) -> int:
    """Autoregressive steps in the loss at ``step``: start, +1 every ``increase_every`` steps, capped at max."""
    if config.increase_every == 0:
        return config.start
    return min(config.max, config.start + step // config.increase_every)

"""Linear weights cast once per training step under autocast.

Autocast casts a weight at each use, and a checkpointed segment's recomputation in backward casts it again (its
cache lives only inside one autocast context); the gradient comes back through as many casts. Inside
:func:`linear_weights_cast_once` each ``nn.Linear`` holds its autocast-dtype copy, made by one differentiable cast,
for the forward and the backward of a step: autocast then finds the weights in its dtype and casts nothing, the
recomputation reuses the copies, and each gradient reaches its fp32 parameter through one cast back. Forward values
are those of autocast (the same cast of the same weights); gradients of a weight used several times sum in the
autocast dtype before the one cast back, as autocast's cache already makes them within one context.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def linear_weights_cast_once(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within: every floating ``nn.Linear`` weight and bias of ``model`` not already ``dtype`` is its ``dtype``
    copy (autograd-tracked); the parameters are back in place on exit, also on an error. Spans forward and backward."""
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    try:
        for module in model.modules():
            if not isinstance(module, nn.Linear):
                continue
            for name in ("weight", "bias"):
                parameter = module._parameters.get(name)
                if parameter is not None and parameter.is_floating_point() and parameter.dtype != dtype:
                    swapped.append((module, name, parameter))
                    module._parameters[name] = parameter.to(dtype)  # type: ignore[assignment]
        yield
    finally:
        for module, name, parameter in reversed(swapped):
            module._parameters[name] = parameter

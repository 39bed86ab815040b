"""Linear weights cast once per training step under autocast, all in one multi-tensor copy.

Autocast casts a weight at each use, and a checkpointed segment's recomputation in backward casts it again (its
cache lives only inside one autocast context); each gradient comes back through as many casts, one kernel each.
Inside :func:`linear_weights_cast_once` each ``nn.Linear`` holds its autocast-dtype copy for the forward and the
backward of a step: all copies are made by one ``_foreach_copy_`` (one multi-tensor kernel on a GPU), autocast then
finds the weights in its dtype and casts nothing, the recomputation reuses the copies, and the gradients reach the
fp32 parameters through one multi-tensor copy back. Forward values are autocast's (the same rounding of the same
weights); gradients of a weight used several times sum in the autocast dtype before the copy back, as autocast's
cache already makes them within one context.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor, nn


class _CastAll(torch.autograd.Function):
    """``(dtype, *tensors) -> tensors in dtype``; gradients back in each input's dtype; one multi-tensor copy each
    way (a gradient that is None stays None)."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.dtypes = [t.dtype for t in tensors]
        copies = [torch.empty_like(t, dtype=dtype) for t in tensors]
        torch._foreach_copy_(copies, list(tensors))
        return tuple(copies)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        given = [i for i, g in enumerate(grads) if g is not None]
        back: list[Tensor | None] = [None] * len(grads)
        wide = [torch.empty_like(grads[i], dtype=ctx.dtypes[i]) for i in given]  # type: ignore[arg-type]
        if wide:
            torch._foreach_copy_(wide, [grads[i] for i in given])
        for i, grad in zip(given, wide, strict=True):
            back[i] = grad
        return (None, *back)


_LINEAR_SLOTS: weakref.WeakKeyDictionary[nn.Module, list[tuple[nn.Module, str]]] = weakref.WeakKeyDictionary()
"""Per model (dropped with it): its ``nn.Linear`` weight and bias slots, found once rather than every step."""


def _linear_slots(model: nn.Module) -> list[tuple[nn.Module, str]]:
    if model not in _LINEAR_SLOTS:
        _LINEAR_SLOTS[model] = [
            (module, name)
            for module in model.modules()
            if isinstance(module, nn.Linear)
            for name in ("weight", "bias")
            if module._parameters.get(name) is not None
        ]
    return _LINEAR_SLOTS[model]


@contextlib.contextmanager
def linear_weights_cast_once(model: nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Within: every floating ``nn.Linear`` weight and bias of ``model`` not already ``dtype`` is its ``dtype``
    copy (autograd-tracked); the parameters are back in place on exit, also on an error. Spans forward and backward."""
    slots = [
        (module, name)
        for module, name in _linear_slots(model)
        if (p := module._parameters[name]).is_floating_point() and p.dtype != dtype
    ]
    parameters = [module._parameters[name] for module, name in slots]
    trained = [p for p in parameters if p.requires_grad]  # frozen ones: copies outside autograd
    cast = iter(_CastAll.apply(dtype, *trained) if trained else ())
    copies = [next(cast) if p.requires_grad else p.detach().to(dtype) for p in parameters]
    try:
        for (module, name), copy in zip(slots, copies, strict=True):
            module._parameters[name] = copy
        yield
    finally:
        for (module, name), parameter in zip(slots, parameters, strict=True):
            module._parameters[name] = parameter

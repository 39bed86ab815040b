"""Mixed and reduced precision in the model's own kernels (custom autograd Functions and their buffers).

Under ``torch.autocast`` torch's matmuls take their inputs in the autocast dtype (bf16 or fp16). Inside a custom
autograd Function autocast still acts op by op: it casts a matmul's inputs but not its preallocated ``out=``
buffer (an error), and during backward it is on or off as the caller of ``backward()`` has it. So the model's
Functions are applied through ``apply_autocast``: under autocast their floating inputs are cast to the autocast
dtype first (an ordinary differentiable cast, so fp32 parameters still get fp32 gradients) and they run with
autocast off, in the one dtype of their inputs, as they do for a model converted to bf16; their backward is
decorated with ``backward_without_autocast``. Inside, the big products run in that dtype while reductions
(softmax statistics, sums over edges or rows, gradient accumulators) run in ``accumulation_dtype``: fp32 for
16-bit inputs. Without autocast nothing is cast and fp32 code paths are unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for bf16 and fp16; fp32 and fp64 themselves."""
    return torch.promote_types(dtype, torch.float32)


def autocast_dtype(t: Tensor) -> torch.dtype:
    """The dtype autocast gives ``t`` as a matmul input: the autocast dtype when autocast is on for t's device
    type and t is floating but not fp64 (which autocast leaves alone); else t's own dtype."""
    kind = t.device.type
    if t.is_floating_point() and t.dtype != torch.float64 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return t.dtype


def cast_like_autocast(*args: T) -> tuple[T, ...]:
    """``args`` with every tensor cast to ``autocast_dtype`` (differentiably); the same objects, no copy, when
    autocast is off. Other arguments (None, index plans) pass through."""
    return tuple(a.to(autocast_dtype(a)) if isinstance(a, Tensor) else a for a in args)


def apply_autocast(function: type[torch.autograd.Function], *args: object) -> Tensor:
    """``function.apply(*args)``; under autocast (for the device of the first argument, a tensor) the inputs are
    cast by ``cast_like_autocast`` and the Function runs with autocast off."""
    kind = args[0].device.type
    if not torch.is_autocast_enabled(kind):
        return function.apply(*args)
    args = cast_like_autocast(*args)
    with torch.autocast(kind, enabled=False):
        return function.apply(*args)


def backward_without_autocast(backward: Callable[..., T]) -> Callable[..., T]:
    """Decorates a Function's ``backward(ctx, grad, ...)`` to run with autocast off for the gradient's device
    type: ``backward()`` may be called inside an autocast region, where autocast would recast the inputs of the
    Function's ``out=`` ops."""

    @functools.wraps(backward)
    def run(ctx: object, *grads: Tensor) -> T:
        kind = grads[0].device.type
        if not torch.is_autocast_enabled(kind):
            return backward(ctx, *grads)
        with torch.autocast(kind, enabled=False):
            return backward(ctx, *grads)

    return run


def add_product_(acc: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``acc += a @ b`` in place. When ``a`` and ``b`` are narrower than ``acc`` (bf16 into an fp32 accumulator),
    the product runs in their dtype (one matmul, rounded once) and is added in acc's."""
    return acc.addmm_(a, b) if a.dtype == acc.dtype else acc.add_(torch.mm(a, b))

"""Node MLP (Linear -> GELU -> Linear) that keeps only its input for backward and works in row blocks.

The hidden layer (``mlp_hidden_ratio`` times wider than the channels) is never stored: forward and backward
compute it for one block of rows at a time in reused scratch buffers, so its memory is bounded by the block's
elements (``model.block_elements``, by default per device: ``ops.workspace.resolve_block_elements``) whatever the
node count. Backward recomputes the first linear layer and the GELU.

Under autocast the inputs are cast to the autocast dtype (``models/ops/autocast.py``); the matmuls and GELU run in
the dtype of the inputs, the weight gradients accumulate over row blocks in fp32 (or wider).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from anemo_like.models.ops.autocast import accumulation_dtype, add_product_, apply_autocast, backward_without_autocast
from anemo_like.models.ops.workspace import resolve_block_elements, scratch


def _row_blocks(rows: int, hidden: int, elements: int) -> tuple[list[slice], int]:
    """Blocks of rows whose hidden activations hold at most ``elements`` (one row at least), and the elements of
    the largest block (scratch buffers are reserved at that size)."""
    step = max(1, elements // hidden)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)], min(step, rows) * hidden


def _hidden(name: str, x: Tensor, w1: Tensor, b1: Tensor, rows: slice, reserve: int) -> Tensor:
    """x[rows] @ w1.T + b1 into scratch ``name``, (R, hidden)."""
    out = scratch(name, (rows.stop - rows.start, w1.shape[0]), x, reserve=reserve)
    return torch.addmm(b1, x[rows], w1.t(), out=out)


def _gelu(h: Tensor, name: str, reserve: int) -> Tensor:
    return torch.ops.aten.gelu.out(h, out=scratch(name, tuple(h.shape), h, reserve=reserve))


class _RecomputedMLP(torch.autograd.Function):
    """x (..., C) -> (..., C_out), all inputs in one dtype; saves only x and the weights. The hidden layer is made
    in blocks of at most ``elements``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, elements: int) -> Tensor:
        ctx.save_for_backward(x, w1, b1, w2)
        ctx.elements = elements
        x2 = x.reshape(-1, x.shape[-1])
        out = x2.new_empty(x2.shape[0], w2.shape[0])
        blocks, reserve = _row_blocks(x2.shape[0], w1.shape[0], elements)
        for rows in blocks:
            hidden = _hidden("mlp_h", x2, w1, b1, rows, reserve)
            torch.addmm(b2, _gelu(hidden, "mlp_g", reserve), w2.t(), out=out[rows])
        return out.view(*x.shape[:-1], -1)

    @staticmethod
    @backward_without_autocast
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        x, w1, b1, w2 = ctx.saved_tensors
        x2 = x.reshape(-1, x.shape[-1])
        grad_out2 = grad_out.reshape(-1, grad_out.shape[-1])
        grad_x = torch.empty_like(x2)
        wide = accumulation_dtype(x.dtype)
        grad_w1, grad_b1, grad_w2 = (torch.zeros_like(t, dtype=wide) for t in (w1, b1, w2))
        blocks, reserve = _row_blocks(x2.shape[0], w1.shape[0], ctx.elements)
        for rows in blocks:
            hidden = _hidden("mlp_h", x2, w1, b1, rows, reserve)
            add_product_(grad_w2, grad_out2[rows].t(), _gelu(hidden, "mlp_g", reserve))
            grad_act = torch.mm(grad_out2[rows], w2, out=scratch("mlp_g", tuple(hidden.shape), hidden))
            grad_hidden = torch.ops.aten.gelu_backward.grad_input(
                grad_act, hidden, grad_input=scratch("mlp_gh", tuple(hidden.shape), hidden, reserve)
            )
            add_product_(grad_w1, grad_hidden.t(), x2[rows])
            grad_b1.add_(grad_hidden.sum(0))
            torch.mm(grad_hidden, w1, out=grad_x[rows])
        grad_w1, grad_b1, grad_w2 = grad_w1.to(w1.dtype), grad_b1.to(b1.dtype), grad_w2.to(w2.dtype)
        return grad_x.view_as(x), grad_w1, grad_b1, grad_w2, grad_out2.sum(0), None


class MLP(nn.Module):
    """(..., C) -> (..., C) through a hidden layer of ``hidden`` units; the hidden activations are not stored."""

    def __init__(self, channels: int, hidden: int, block_elements: int | None = None) -> None:
        """``block_elements``: hidden activations made at a time (None: the default for the input's device)."""
        super().__init__()
        self.fc1 = nn.Linear(channels, hidden)
        self.fc2 = nn.Linear(hidden, channels)
        self.block_elements = block_elements

    def forward(self, x: Tensor) -> Tensor:
        """x: (..., C) -> (..., C)."""
        if torch.compiler.is_compiling():  # traceable ops, which inductor fuses; the hidden layer is stored
            return self.fc2(F.gelu(self.fc1(x)))
        elements = resolve_block_elements(self.block_elements, x.device)
        weights = (self.fc1.weight, self.fc1.bias, self.fc2.weight, self.fc2.bias)
        return apply_autocast(_RecomputedMLP, x, *weights, elements)

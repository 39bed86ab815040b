"""Graph attention as fused Triton kernels (backend ``triton``), registered as torch.library custom ops.

Same maths and call signature as ``graph_attention_torch``. The edge embedding e = W a + b is an ordinary autograd
op; attention itself is the custom op ``anemo_like::graph_attention`` (returns out and the per-(node, head)
log-sum-exp) whose backward is the custom op ``anemo_like::graph_attention_backward``.

The kernels (``triton_kernels.py``) run one program per node over the whole row of all heads. The index
tensors (row pointers, the source-order permutation) are built once per ``SortedEdges``, device and source count,
and cached.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from anemo_like.models.ops.autocast import cast_like_autocast
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.triton_kernels import backward_dst_kernel, backward_src_kernel, forward_kernel, launch_config

try:
    import triton
except ImportError:  # triton is an optional extra: triton_unavailable_reason says so when the backend is used
    triton = None


def triton_unavailable_reason(device: torch.device) -> str | None:
    """None when the kernels can run on tensors on ``device`` (a CUDA device, or any device with TRITON_INTERPRET=1,
    which must be set before triton is first imported), else why not, in one sentence."""
    if triton is None:
        return "triton is not installed (pip install anemo-like[triton])"
    device = torch.device(device)
    if device.type == "cuda" or _interpret_mode():
        return None
    return f"tensors are on {device.type} and TRITON_INTERPRET=1 is not set: Triton kernels need a CUDA GPU"


def _interpret_mode() -> bool:
    """Whether TRITON_INTERPRET asks for the interpreter, read the way triton reads it."""
    knobs = getattr(triton, "knobs", None)  # triton >= 3.4; earlier versions compare the variable with "1"
    return bool(knobs.runtime.interpret) if knobs is not None else os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class AttentionIndex:
    """Index tensors (int64, on one device) of one destination-sorted edge set."""

    dst_ptr: Tensor  # (N_dst + 1,) the edges of destination i are [dst_ptr[i], dst_ptr[i + 1])
    src: Tensor  # (E,) source of each edge, destination order
    src_ptr: Tensor  # (N_src + 1,) the edges of source j are src_order[src_ptr[j] : src_ptr[j + 1]]
    src_order: Tensor  # (E,) edge ids sorted by source (stable)
    src_order_dst: Tensor  # (E,) destination of each edge, source order

    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The index arguments of the custom ops, in order."""
        return self.dst_ptr, self.src, self.src_ptr, self.src_order, self.src_order_dst


_ATTENTION_INDEX: weakref.WeakKeyDictionary[SortedEdges, dict[tuple[torch.device, int], AttentionIndex]] = (
    weakref.WeakKeyDictionary()
)
"""Per edge set (dropped with it), per (device, N_src): its index tensors."""


def attention_index(edges: SortedEdges, device: torch.device, num_src: int) -> AttentionIndex:
    """The index tensors of ``edges`` on ``device`` for ``num_src`` source nodes; built once, then cached for as
    long as ``edges`` lives. A cache hit traces under ``torch.compile``; a miss is a graph break (an error with
    ``fullgraph=True``: call this once eagerly first)."""
    per_edges = _ATTENTION_INDEX.setdefault(edges, {})
    key = (torch.device(device), num_src)
    if key not in per_edges:
        per_edges[key] = _build_attention_index(edges, key[0], num_src)
    return per_edges[key]


@torch.compiler.disable  # host-side and data-dependent: a graph break under torch.compile on a cache miss
def _build_attention_index(edges: SortedEdges, device: torch.device, num_src: int) -> AttentionIndex:
    src = edges.src.to(device=device, dtype=torch.int64).contiguous()
    dst = edges.dst.to(device=device, dtype=torch.int64).contiguous()
    for name, index, bound in (("source", src, num_src), ("destination", dst, edges.num_dst)):
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= bound):
            raise ValueError(f"graph-attention edges have a {name} index outside [0, {bound})")
    src_order = torch.argsort(src, stable=True)
    return AttentionIndex(_row_pointer(dst, edges.num_dst), src, _row_pointer(src, num_src), src_order, dst[src_order])


def _row_pointer(index: Tensor, rows: int) -> Tensor:
    """(rows + 1,) start of each row's run in ``index`` sorted: 0 then the cumulative row counts."""
    counts = torch.bincount(index, minlength=rows)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _require_triton(device: torch.device) -> None:
    reason = triton_unavailable_reason(device)
    if reason is not None:
        raise RuntimeError(f"graph attention backend 'triton' cannot run: {reason}")


@torch.library.custom_op("anemo_like::graph_attention", mutates_args=())
def graph_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    dst_ptr: Tensor,
    src: Tensor,
    src_ptr: Tensor,
    src_order: Tensor,
    src_order_dst: Tensor,
) -> tuple[Tensor, Tensor]:
    """Attention of q (B, N_dst, H, C) over k, v (B, N_src, H, C) with edge embedding e (E, H, C) along the edges
    of ``AttentionIndex.tensors()``. Returns out (B, N_dst, H, C, dtype of q) and the log-sum-exp (B, N_dst, H, fp32;
    0 where a destination has no edge). The source-order indices are only used by the backward."""
    _require_triton(q.device)
    q, k, v, e = q.contiguous(), k.contiguous(), v.contiguous(), e.contiguous()
    batch, num_dst, heads, channels = q.shape
    out = q.new_empty(q.shape)
    log_sum_exp = q.new_empty(q.shape[:-1], dtype=torch.float32)
    if out.numel():
        forward_kernel[(num_dst, batch)](
            q, k, v, e, dst_ptr, src, out, log_sum_exp,
            num_dst, k.shape[1], heads, channels, 1.0 / math.sqrt(channels), **launch_config(heads, channels),
        )  # fmt: skip
    return out, log_sum_exp


@graph_attention_op.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, e: Tensor, *index: Tensor) -> tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("anemo_like::graph_attention_backward", mutates_args=())
def graph_attention_backward_op(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    e: Tensor,
    out: Tensor,
    log_sum_exp: Tensor,
    dst_ptr: Tensor,
    src: Tensor,
    src_ptr: Tensor,
    src_order: Tensor,
    src_order_dst: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Gradients (q, k, v, e), each in its input's dtype, of ``graph_attention`` given grad_out (B, N_dst, H, C)
    and the forward's out and log-sum-exp."""
    _require_triton(q.device)
    grad_out, q, k, v, e, out = (t.contiguous() for t in (grad_out, q, k, v, e, out))
    batch, num_dst, heads, channels = q.shape
    num_src, scale, config = k.shape[1], 1.0 / math.sqrt(channels), launch_config(heads, channels)
    grad_q, grad_k, grad_v = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    grad_e = torch.zeros(e.shape, dtype=torch.float32, device=e.device)  # batch-summed in the kernel
    delta = q.new_empty(q.shape[:-1], dtype=torch.float32)
    if grad_q.numel():
        backward_dst_kernel[(num_dst,)](
            q, k, v, e, out, grad_out, log_sum_exp, dst_ptr, src, grad_q, grad_e, delta,
            batch, num_dst, num_src, heads, channels, scale, **config,
        )  # fmt: skip
    if grad_k.numel():
        backward_src_kernel[(num_src, batch)](
            q, k, v, e, grad_out, log_sum_exp, delta, src_ptr, src_order, src_order_dst, grad_k, grad_v,
            num_dst, num_src, heads, channels, scale, **config,
        )  # fmt: skip
    return grad_q, grad_k, grad_v, grad_e.to(e.dtype)


@graph_attention_backward_op.register_fake
def _(grad_out: Tensor, q: Tensor, k: Tensor, v: Tensor, e: Tensor, *saved: Tensor) -> tuple[Tensor, ...]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), e.new_empty(e.shape)


def _setup_context(ctx: Any, inputs: tuple[Tensor, ...], output: tuple[Tensor, Tensor]) -> None:
    out, log_sum_exp = output
    ctx.mark_non_differentiable(log_sum_exp)
    ctx.save_for_backward(*inputs, out, log_sum_exp)


def _backward(ctx: Any, grad_out: Tensor, _grad_log_sum_exp: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, e, *index, out, log_sum_exp = ctx.saved_tensors
    grads = graph_attention_backward_op(grad_out, q, k, v, e, out, log_sum_exp, *index)
    return (*grads, None, None, None, None, None)


graph_attention_op.register_autograd(_backward, setup_context=_setup_context)


def graph_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    edge_attr: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    edges: SortedEdges,
    *,
    min_blocks: int = 1,
    block_elements: int | None = None,
) -> Tensor:
    """Edge-softmax attention in fused Triton kernels; same arguments and result as ``graph_attention_torch``.

    Args:
        q: (B, N_dst, H, C) queries.
        k, v: (B, N_src, H, C) keys and values.
        edge_attr: (E, A) edge features; ``weight`` (H*C, A) and ``bias`` (H*C,) or None embed them (autograd).
        edges: the destination-sorted edges.
        min_blocks, block_elements: ignored: the kernels stream each node's edges a tile at a time, so
            beyond the (E, H, C) edge embedding no per-edge tensor exists and there is nothing to split.

    Returns:
        (B, N_dst, H, C) attention output, dtype of ``q`` (the autocast dtype under autocast: the inputs are cast to
        it as a matmul's; the kernels load any of fp32, bf16, fp16 and compute in fp32).
    """
    q, k, v, edge_attr, weight, bias = cast_like_autocast(q, k, v, edge_attr, weight, bias)
    index = attention_index(edges, q.device, k.shape[1])
    e = F.linear(edge_attr, weight, bias).unflatten(-1, q.shape[-2:])
    out, _ = graph_attention_op(q, k, v, e, *index.tensors())
    return out

"""Graph attention as fused Triton kernels (backend ``triton``), registered as torch.library custom ops.

Same maths and call signature as ``graph_attention_torch``. The edge embedding e = W a + b is an ordinary autograd
op; attention itself is the custom op ``anemo_like::graph_attention`` (returns out and the per-(node, head)
log-sum-exp) whose backward is the custom op ``anemo_like::graph_attention_backward``.

Kernels (one program per node and head; channels padded to a power of two and masked, fp32 arithmetic):
- forward, per (destination, batch * head): walks the destination's incoming edges EDGES_PER_STEP at a time through the
  CSC row pointer, online softmax, accumulates sum alpha (v + e); writes out and the log-sum-exp.
- backward by destination, per (destination, head), batch looped inside: recomputes alpha from the log-sum-exp,
  writes grad_q and delta = <dout, out>, and accumulates the batch-summed grad_e of the node's edges (each edge
  belongs to one program, so no atomics).
- backward by source, per (source, batch * head): walks the source's outgoing edges in source order (CSR: a
  source row pointer and a permutation of the edges), recomputes alpha and the score gradient, writes grad_k and
  grad_v once.
The row pointers and the permutation are built once per ``SortedEdges``, device and source count, and cached.
"""

from __future__ import annotations

import math
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from anemo_like.models.ops.autocast import cast_like_autocast
from anemo_like.models.ops.chunking import SortedEdges

try:
    import triton
    import triton.language as tl
except ImportError:  # triton is an optional extra: triton_unavailable_reason says so when the backend is used
    triton = tl = None

EDGES_PER_STEP = 16
"""Edges handled per step of a kernel's edge loop (BLOCK_E)."""


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


def _jit(fn: Callable) -> Callable:
    """``triton.jit``: compiled kernels, or interpreted ones when TRITON_INTERPRET was set before triton and this
    module were imported (triton decides when it wraps a function). Without triton the plain function, never run."""
    return fn if triton is None else triton.jit(fn)


# Kernels. Tensors are contiguous: node tensors (B, N, H, C), the edge embedding (E, H, C), statistics
# (B, N_dst, H); row and edge offsets are int64.


@_jit
def _destination_edge_tile(
    K, V, EMB, SRC, first, stop, batch, num_src, heads, head, channels, chan, chan_mask,
    BLOCK_E: tl.constexpr,
):  # fmt: skip
    """Edges [first, first + BLOCK_E) of one destination (those before ``stop``), one head of one sample: the
    edge mask, the (BLOCK_E, BLOCK_C) tile mask and embedding offsets, and keys + embedding, values + embedding
    in fp32."""
    edge = first + tl.arange(0, BLOCK_E)
    edge_mask = edge < stop
    tile_mask = edge_mask[:, None] & chan_mask[None, :]
    source = tl.load(SRC + edge, mask=edge_mask, other=0)
    src_at = (((batch * num_src + source) * heads + head) * channels)[:, None] + chan[None, :]
    emb_at = ((edge * heads + head) * channels)[:, None] + chan[None, :]
    emb = tl.load(EMB + emb_at, mask=tile_mask, other=0.0).to(tl.float32)
    key = tl.load(K + src_at, mask=tile_mask, other=0.0).to(tl.float32) + emb
    value = tl.load(V + src_at, mask=tile_mask, other=0.0).to(tl.float32) + emb
    return edge_mask, tile_mask, emb_at, key, value


@_jit
def _forward_kernel(
    Q, K, V, EMB, DST_PTR, SRC, OUT, LSE, num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64)
    batch_head = tl.program_id(1).to(tl.int64)
    batch, head = batch_head // heads, batch_head % heads
    chan = tl.arange(0, BLOCK_C)
    chan_mask = chan < channels
    row = (batch * num_dst + node) * heads + head
    query = tl.load(Q + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
    start, stop = tl.load(DST_PTR + node), tl.load(DST_PTR + node + 1)
    running_max = tl.full([], float("-inf"), tl.float32)
    denom = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_C], tl.float32)
    for first in range(start, stop, BLOCK_E):
        edge_mask, _, _, key, value = _destination_edge_tile(
            K, V, EMB, SRC, first, stop, batch, num_src, heads, head, channels, chan, chan_mask, BLOCK_E
        )
        score = tl.where(edge_mask, tl.sum(key * query[None, :], axis=1) * scale, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(score, axis=0))
        weight = tl.exp(score - new_max)
        rescale = tl.exp(running_max - new_max)
        denom = denom * rescale + tl.sum(weight, axis=0)
        acc = acc * rescale + tl.sum(weight[:, None] * value, axis=0)
        running_max = new_max
    has_edges = denom > 0.0
    safe_denom = tl.where(has_edges, denom, 1.0)
    tl.store(OUT + row * channels + chan, (acc / safe_denom).to(OUT.dtype.element_ty), mask=chan_mask)
    tl.store(LSE + row, tl.where(has_edges, running_max + tl.log(safe_denom), 0.0))


@_jit
def _backward_dst_kernel(
    Q, K, V, EMB, OUT, GRAD_OUT, LSE, DST_PTR, SRC, GRAD_Q, GRAD_EMB, DELTA,
    batch_size, num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    node = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    chan = tl.arange(0, BLOCK_C)
    chan_mask = chan < channels
    start, stop = tl.load(DST_PTR + node), tl.load(DST_PTR + node + 1)
    for batch in range(0, batch_size):
        row = (batch * num_dst + node) * heads + head
        query = tl.load(Q + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
        grad_out = tl.load(GRAD_OUT + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
        out = tl.load(OUT + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
        delta = tl.sum(grad_out * out, axis=0)
        tl.store(DELTA + row, delta)
        log_sum_exp = tl.load(LSE + row)
        grad_query = tl.zeros([BLOCK_C], tl.float32)
        for first in range(start, stop, BLOCK_E):
            edge_mask, tile_mask, emb_at, key, value = _destination_edge_tile(
                K, V, EMB, SRC, first, stop, batch, num_src, heads, head, channels, chan, chan_mask, BLOCK_E
            )
            score = tl.sum(key * query[None, :], axis=1) * scale
            alpha = tl.where(edge_mask, tl.exp(score - log_sum_exp), 0.0)
            grad_score = alpha * (tl.sum(value * grad_out[None, :], axis=1) - delta)
            grad_query += scale * tl.sum(grad_score[:, None] * key, axis=0)
            grad_emb = scale * grad_score[:, None] * query[None, :] + alpha[:, None] * grad_out[None, :]
            grad_emb += tl.load(GRAD_EMB + emb_at, mask=tile_mask & (batch > 0), other=0.0)
            tl.store(GRAD_EMB + emb_at, grad_emb, mask=tile_mask)
        tl.store(GRAD_Q + row * channels + chan, grad_query.to(GRAD_Q.dtype.element_ty), mask=chan_mask)


@_jit
def _backward_src_kernel(
    Q, K, V, EMB, GRAD_OUT, LSE, DELTA, SRC_PTR, SRC_ORDER, SRC_ORDER_DST, GRAD_K, GRAD_V,
    num_dst, num_src, heads, channels, scale,
    BLOCK_E: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    source = tl.program_id(0).to(tl.int64)
    batch_head = tl.program_id(1).to(tl.int64)
    batch, head = batch_head // heads, batch_head % heads
    chan = tl.arange(0, BLOCK_C)
    chan_mask = chan < channels
    row = (batch * num_src + source) * heads + head
    key = tl.load(K + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
    value = tl.load(V + row * channels + chan, mask=chan_mask, other=0.0).to(tl.float32)
    start, stop = tl.load(SRC_PTR + source), tl.load(SRC_PTR + source + 1)
    grad_key = tl.zeros([BLOCK_C], tl.float32)
    grad_value = tl.zeros([BLOCK_C], tl.float32)
    for first in range(start, stop, BLOCK_E):
        slot = first + tl.arange(0, BLOCK_E)
        edge_mask = slot < stop
        tile_mask = edge_mask[:, None] & chan_mask[None, :]
        edge = tl.load(SRC_ORDER + slot, mask=edge_mask, other=0)
        dst_row = (batch * num_dst + tl.load(SRC_ORDER_DST + slot, mask=edge_mask, other=0)) * heads + head
        dst_at = (dst_row * channels)[:, None] + chan[None, :]
        emb = tl.load(EMB + ((edge * heads + head) * channels)[:, None] + chan[None, :], mask=tile_mask, other=0.0)
        emb = emb.to(tl.float32)
        query = tl.load(Q + dst_at, mask=tile_mask, other=0.0).to(tl.float32)
        grad_out = tl.load(GRAD_OUT + dst_at, mask=tile_mask, other=0.0).to(tl.float32)
        log_sum_exp = tl.load(LSE + dst_row, mask=edge_mask, other=0.0)
        delta = tl.load(DELTA + dst_row, mask=edge_mask, other=0.0)
        score = tl.sum(query * (key[None, :] + emb), axis=1) * scale
        alpha = tl.where(edge_mask, tl.exp(score - log_sum_exp), 0.0)
        grad_score = alpha * (tl.sum(grad_out * (value[None, :] + emb), axis=1) - delta)
        grad_key += scale * tl.sum(grad_score[:, None] * query, axis=0)
        grad_value += tl.sum(alpha[:, None] * grad_out, axis=0)
    tl.store(GRAD_K + row * channels + chan, grad_key.to(GRAD_K.dtype.element_ty), mask=chan_mask)
    tl.store(GRAD_V + row * channels + chan, grad_value.to(GRAD_V.dtype.element_ty), mask=chan_mask)


def _launch_config(channels: int) -> dict[str, int | bool]:
    """Compile-time block sizes and compiler options for head width ``channels`` (FMA fusion asked for explicitly:
    triton's default for it is changing)."""
    block_c = 1 << max(0, channels - 1).bit_length()
    tile = EDGES_PER_STEP * block_c
    num_warps = 4 if tile >= 2048 else 2 if tile >= 512 else 1
    return {"BLOCK_E": EDGES_PER_STEP, "BLOCK_C": block_c, "num_warps": num_warps, "enable_fp_fusion": True}


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
        _forward_kernel[(num_dst, batch * heads)](
            q, k, v, e, dst_ptr, src, out, log_sum_exp,
            num_dst, k.shape[1], heads, channels, 1.0 / math.sqrt(channels), **_launch_config(channels),
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
    num_src, scale, config = k.shape[1], 1.0 / math.sqrt(channels), _launch_config(channels)
    grad_q, grad_k, grad_v = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
    grad_e = torch.zeros(e.shape, dtype=torch.float32, device=e.device)  # batch-summed in the kernel
    delta = q.new_empty(q.shape[:-1], dtype=torch.float32)
    if grad_q.numel():
        _backward_dst_kernel[(num_dst, heads)](
            q, k, v, e, out, grad_out, log_sum_exp, dst_ptr, src, grad_q, grad_e, delta,
            batch, num_dst, num_src, heads, channels, scale, **config,
        )  # fmt: skip
    if grad_k.numel():
        _backward_src_kernel[(num_src, batch * heads)](
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
        min_blocks, block_elements: ignored: the kernels stream each node's edges ``EDGES_PER_STEP`` at a time, so
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

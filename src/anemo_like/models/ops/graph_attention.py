"""Graph attention: each destination node attends over its incoming edges.

For destination i, head h, with incoming edges j -> i carrying edge embedding e_ij = W a_ij + b (a: edge features):
    alpha_ij = softmax_j( <q_i, k_j + e_ij> / sqrt(C) ),   out_i = sum_j alpha_ij (v_j + e_ij)
A destination without incoming edges gets zeros. The edge embedding is part of the attention call, so a backend
may recompute it instead of storing an (E, H, C) tensor.

Backends (``model.graph_attention_backend``):
- ``torch``: plain torch, custom autograd, fused over destination-aligned edge blocks of bounded size
  (``block_elements``: per-edge tensors of at most that many elements, by default per device). Saves only
  node-sized tensors, the small edge features and the per-node log-sum-exp; the edge embedding, scores, weights
  and messages exist for one block at a time and are recomputed in backward.
- ``reference``: the same maths as ordinary autograd ops over all edges at once (keeps every per-edge tensor).
- ``triton``: fused Triton kernels (``triton_graph_attention``) on CUDA; where they cannot run (no GPU, no
  triton) the ``torch`` backend runs instead and one log line says why (``model.strict_backends`` makes it an
  error at setup: ``runtime/backends.py``).

Precision: every backend takes its inputs in one dtype, cast to the autocast dtype under autocast
(``models/ops/autocast.py``), and returns the output in it. The edge embedding, gathers and k + e, v + e run in
that dtype; scores, the softmax statistics and the sums over edges accumulate in fp32 (or wider: fp64 stays).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from anemo_like.models.ops.autocast import (
    accumulation_dtype,
    apply_autocast,
    backward_without_autocast,
    cast_like_autocast,
)
from anemo_like.models.ops.chunking import EdgeBlock, SortedEdges
from anemo_like.models.ops.triton_graph_attention import graph_attention_triton, triton_unavailable_reason
from anemo_like.models.ops.workspace import resolve_block_elements, scratch

LOG = logging.getLogger(__name__)
_reported: set[str] = set()  # fallback reasons already logged


def edges_per_block(batch: int, heads: int, channels: int, elements: int) -> int:
    """Largest power of two of edges whose (B, E, H, C) tensor stays within ``elements``."""
    fit = max(1, elements // (batch * heads * channels))
    return 1 << (fit.bit_length() - 1)


def _segment_max(scores: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """Per-destination maximum of ``scores`` (B, E, H) over its edges -> (B, N_dst, H); -inf where no edge."""
    out = scores.new_full((scores.shape[0], num_dst, scores.shape[2]), -torch.inf)
    return out.scatter_reduce_(1, dst.view(1, -1, 1).expand_as(scores), scores, reduce="amax", include_self=True)


def graph_attention_reference(
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
    """Edge-softmax attention as plain autograd ops.

    Args:
        q: (B, N_dst, H, C) queries.
        k, v: (B, N_src, H, C) keys and values.
        edge_attr: (E, A) edge features, shared over the batch; ``weight`` (H*C, A) and ``bias`` (H*C,) embed them.
        edges: the destination-sorted edges.
        min_blocks, block_elements: ignored (this backend never splits the edges).

    Returns:
        (B, N_dst, H, C) attention output, dtype of ``q`` (the autocast dtype under autocast).
    """
    q, k, v, edge_attr, weight, bias = cast_like_autocast(q, k, v, edge_attr, weight, bias)
    src, dst = edges.src, edges.dst
    e = F.linear(edge_attr, weight, bias).unflatten(-1, q.shape[-2:])
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("behc,behc->beh", q.index_select(1, dst), k.index_select(1, src) + e)
    scores = scores.to(accumulation_dtype(scores.dtype)) * scale
    # The softmax is shift-invariant, so the per-destination maximum only guards against overflow: no gradient.
    with torch.no_grad():
        row_max = _segment_max(scores, dst, q.shape[1])
    weights = torch.exp(scores - row_max.index_select(1, dst))
    denom = weights.new_zeros(row_max.shape).index_add_(1, dst, weights)
    weights = weights / denom.index_select(1, dst)
    messages = weights.unsqueeze(-1) * (v.index_select(1, src) + e)  # in the accumulation dtype
    return messages.new_zeros(q.shape).index_add_(1, dst, messages).to(q.dtype)


class _BlockScratch:
    """Per-edge scratch tensors of one block, views of buffers sized for the largest block of the call.

    A buffer is named and comes in q's dtype or (``wide``) in its accumulation dtype; when the two agree (fp32,
    fp64) the wide buffer of a name is the narrow one, so a wide result may overwrite its narrow operand.
    """

    def __init__(self, q: Tensor, blocks: tuple[EdgeBlock, ...]) -> None:
        self.q, self.wide_dtype = q, accumulation_dtype(q.dtype)
        self.max_edges = max((b.edge_stop - b.edge_start for b in blocks), default=0)

    def edges(
        self, name: str, block: EdgeBlock, batch: bool = True, channels: bool = True, wide: bool = False
    ) -> Tensor:
        """(B?, E_block, H, C?) scratch named ``name``, in q's dtype or (``wide``) its accumulation dtype."""
        batch_size, _, heads, width = self.q.shape
        shape = ((batch_size,) if batch else ()) + (block.edge_stop - block.edge_start, heads)
        shape += (width,) if channels else ()
        per_edge = math.prod(shape) // (block.edge_stop - block.edge_start)
        dtype = self.wide_dtype if wide else self.q.dtype
        return scratch(name, shape, self.q, reserve=per_edge * self.max_edges, dtype=dtype)

    def dot(self, a: Tensor, b: Tensor, block: EdgeBlock, product: str, out: str) -> Tensor:
        """<a, b> of (B, E_block, H, C) tensors over channels into the wide scratch ``out`` (B, E_block, H); the
        elementwise product goes to the wide scratch ``product`` (``a`` itself when that is a's buffer)."""
        products = torch.mul(a, b, out=self.edges(product, block, wide=True))
        return torch.sum(products, dim=-1, out=self.edges(out, block, channels=False, wide=True))


def _embed_edges(block: EdgeBlock, edge_attr: Tensor, weight: Tensor, bias: Tensor | None, out: Tensor) -> Tensor:
    """Edge embedding W a + b of one block into ``out`` (E_block, H, C)."""
    attr, flat = edge_attr[block.edge_start : block.edge_stop], out.view(out.shape[0], -1)
    if bias is None:
        torch.mm(attr, weight.t(), out=flat)
    else:
        torch.addmm(bias, attr, weight.t(), out=flat)
    return out


def _gather_rows(source: Tensor, index: Tensor, out: Tensor) -> Tensor:
    """source[:, index] into ``out`` (B, E_block, ...)."""
    return torch.index_select(source, 1, index, out=out)


class _BlockedGraphAttention(torch.autograd.Function):
    """Forward keeps (q, k, v, edge features, embedding weights, out, log-sum-exp); backward recomputes each
    block's per-edge work, one block at a time, in reused scratch buffers.

    All inputs share one dtype. The edge embedding, gathers and k + e, v + e are made in it; elementwise products,
    scores, softmax statistics and every sum over edges in its accumulation dtype (wide scratch buffers).
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        edge_attr: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        blocks: tuple[EdgeBlock, ...],
    ) -> Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        scratches = _BlockScratch(q, blocks)
        out = torch.zeros_like(q, dtype=scratches.wide_dtype)
        log_sum_exp = q.new_zeros(q.shape[:-1], dtype=scratches.wide_dtype)  # 0 without edges; never read then
        for block in blocks:
            rows, dst = slice(block.dst_start, block.dst_stop), block.dst_local
            e = _embed_edges(block, edge_attr, weight, bias, scratches.edges("e", block, batch=False))
            keys = _gather_rows(k, block.src, scratches.edges("a", block)).add_(e)
            queries = _gather_rows(q[:, rows], dst, scratches.edges("b", block))
            scores = scratches.dot(queries, keys, block, product="b", out="s").mul_(scale)
            row_max = _segment_max(scores, dst, block.dst_stop - block.dst_start).nan_to_num_(neginf=0.0)
            weights = scores.sub_(row_max.index_select(1, dst)).exp_()
            denom = weights.new_zeros(row_max.shape).index_add_(1, dst, weights)
            values = _gather_rows(v, block.src, keys).add_(e)
            messages = torch.mul(values, weights.unsqueeze(-1), out=scratches.edges("a", block, wide=True))
            block_out = out[:, rows].index_add_(1, dst, messages)
            block_out.div_(denom.clamp_min(torch.finfo(denom.dtype).tiny).unsqueeze(-1))
            log_sum_exp[:, rows] = row_max + denom.log()
        ctx.save_for_backward(q, k, v, edge_attr, weight, bias, out, log_sum_exp)  # out unrounded, for backward
        ctx.blocks, ctx.scale = blocks, scale
        return out.to(q.dtype)

    @staticmethod
    @backward_without_autocast
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, edge_attr, weight, bias, out, log_sum_exp = ctx.saved_tensors
        scale, wide = ctx.scale, log_sum_exp.dtype
        grad_out = grad_out.contiguous()
        grad_q, grad_k, grad_v = (torch.zeros_like(t, dtype=wide) for t in (q, k, v))
        grad_attr = torch.zeros_like(edge_attr, dtype=wide) if ctx.needs_input_grad[3] else None
        grad_weight = torch.zeros_like(weight, dtype=wide)
        grad_bias = torch.zeros_like(bias, dtype=wide) if bias is not None else None
        wide_weight = weight.to(wide)
        out_dot_grad = (grad_out.to(wide) * out).sum(-1)  # (B, N_dst, H): <dout_i, out_i>
        scratches = _BlockScratch(q, ctx.blocks)
        for block in ctx.blocks:
            rows, dst, src = slice(block.dst_start, block.dst_stop), block.dst_local, block.src
            e = _embed_edges(block, edge_attr, weight, bias, scratches.edges("e", block, batch=False))
            keys = _gather_rows(k, src, scratches.edges("a", block)).add_(e)
            queries = _gather_rows(q[:, rows], dst, scratches.edges("b", block))
            alpha = scratches.dot(queries, keys, block, product="b", out="s").mul_(scale)
            alpha.sub_(log_sum_exp[:, rows].index_select(1, dst)).exp_()  # attention weights (B, E, H)
            grad_out_edges = _gather_rows(grad_out[:, rows], dst, scratches.edges("b", block))
            # d loss / d score: alpha * (<dout_i, v_j + e_ij> - <dout_i, out_i>)
            values = _gather_rows(v, src, scratches.edges("c", block)).add_(e)
            grad_scores = scratches.dot(values, grad_out_edges, block, product="c", out="t")
            grad_scores.sub_(out_dot_grad[:, rows].index_select(1, dst)).mul_(alpha).mul_(scale)
            grad_values = torch.mul(grad_out_edges, alpha.unsqueeze(-1), out=scratches.edges("c", block, wide=True))
            grad_v.index_add_(1, src, grad_values)
            grad_queries = torch.mul(keys, grad_scores.unsqueeze(-1), out=scratches.edges("a", block, wide=True))
            grad_q[:, rows].index_add_(1, dst, grad_queries)
            queries = _gather_rows(q[:, rows], dst, scratches.edges("b", block))
            grad_keys = torch.mul(queries, grad_scores.unsqueeze(-1), out=scratches.edges("b", block, wide=True))
            grad_k.index_add_(1, src, grad_keys)
            grad_e = scratches.edges("e", block, batch=False, wide=True)
            grad_e = torch.sum(grad_keys.add_(grad_values), dim=0, out=grad_e).flatten(-2)  # (E, H*C), batch summed
            attr = edge_attr[block.edge_start : block.edge_stop]
            grad_weight.addmm_(grad_e.t(), attr.to(wide))
            if grad_bias is not None:
                grad_bias.add_(grad_e.sum(0))
            if grad_attr is not None:
                torch.mm(grad_e, wide_weight, out=grad_attr[block.edge_start : block.edge_stop])
        grads = (grad_q, grad_k, grad_v, grad_attr, grad_weight, grad_bias)
        inputs = (q, k, v, edge_attr, weight, bias)
        return (*(None if g is None else g.to(t.dtype) for g, t in zip(grads, inputs, strict=True)), None)


@torch.compiler.disable(reason="hand-blocked kernel: traced, its block loop unrolls into a huge, slow graph")
def graph_attention_torch(
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
    """Edge-softmax attention over edge blocks (at least ``min_blocks``) whose per-edge tensors hold at most
    ``block_elements`` (None: the default for q's device); same result as the reference.

    ``torch.compile`` runs it eagerly (a graph break): traced, its per-block loop and scratch buffers would unroll
    into one huge graph, minutes to compile and slower than this already fused eager code."""
    batch, _, heads, channels = q.shape
    elements = resolve_block_elements(block_elements, q.device)
    blocks = edges.blocks(edges_per_block(batch, heads, channels, elements), min_blocks)
    return apply_autocast(_BlockedGraphAttention, q, k, v, edge_attr, weight, bias, blocks)


def graph_attention_triton_or_torch(
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
    """The Triton kernels where they can run on ``q``'s device, else the ``torch`` backend (logged once per reason)."""
    reason = triton_unavailable_reason(q.device)
    if reason is None:
        return graph_attention_triton(q, k, v, edge_attr, weight, bias, edges, min_blocks=min_blocks)
    if reason not in _reported:
        _reported.add(reason)
        LOG.warning("graph attention backend triton cannot run here: %s; using torch", reason)
    return graph_attention_torch(
        q, k, v, edge_attr, weight, bias, edges, min_blocks=min_blocks, block_elements=block_elements
    )


GRAPH_ATTENTION_BACKENDS = {
    "torch": graph_attention_torch,
    "reference": graph_attention_reference,
    "triton": graph_attention_triton_or_torch,
}

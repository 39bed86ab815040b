"""Graph attention: each destination node attends over its incoming edges.

For destination i, head h, with incoming edges j -> i carrying edge embedding e_ij:
    a_ij = softmax_j( <q_i, k_j + e_ij> / sqrt(C) ),   out_i = sum_j a_ij (v_j + e_ij)
A destination without incoming edges gets zeros.

Backends (``model.graph_attention_backend``):
- ``torch``: plain torch, custom autograd. Saves only node-sized tensors, the edge embedding and the per-node
  log-sum-exp; per-edge scores, weights and messages are recomputed in backward.
- ``reference``: the same maths written as ordinary autograd ops (keeps every per-edge intermediate).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _segment_max(scores: Tensor, dst: Tensor, num_dst: int) -> Tensor:
    """Per-destination maximum of ``scores`` (B, E, H) over its edges -> (B, N_dst, H); -inf where no edge."""
    out = scores.new_full((scores.shape[0], num_dst, scores.shape[2]), -torch.inf)
    return out.scatter_reduce_(1, dst.view(1, -1, 1).expand_as(scores), scores, reduce="amax", include_self=True)


def graph_attention_reference(q: Tensor, k: Tensor, v: Tensor, e: Tensor, edge_index: Tensor) -> Tensor:
    """Edge-softmax attention as plain autograd ops.

    Args:
        q: (B, N_dst, H, C) queries.
        k, v: (B, N_src, H, C) keys and values.
        e: (E, H, C) edge embeddings, shared over the batch.
        edge_index: (2, E) int64 [source; destination].

    Returns:
        (B, N_dst, H, C) attention output, dtype of ``q``.
    """
    src, dst = edge_index[0], edge_index[1]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("behc,behc->beh", q.index_select(1, dst), k.index_select(1, src) + e) * scale
    # The softmax is shift-invariant, so the per-destination maximum only guards against overflow: no gradient.
    with torch.no_grad():
        row_max = _segment_max(scores, dst, q.shape[1])
    weights = torch.exp(scores - row_max.index_select(1, dst))
    denom = weights.new_zeros(row_max.shape).index_add_(1, dst, weights)
    weights = weights / denom.index_select(1, dst)
    messages = weights.unsqueeze(-1) * (v.index_select(1, src) + e)
    return q.new_zeros(q.shape).index_add_(1, dst, messages.to(q.dtype))


def _scores(q: Tensor, k: Tensor, e: Tensor, src: Tensor, dst: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """(keys k_j + e_ij (B, E, H, C), scores <q_i, k_j + e_ij> * scale (B, E, H))."""
    keys = k.index_select(1, src).add_(e)
    return keys, torch.einsum("behc,behc->beh", q.index_select(1, dst), keys).mul_(scale)


class _GraphAttention(torch.autograd.Function):
    """Forward keeps (q, k, v, e, out, log-sum-exp); backward recomputes the per-edge work."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, e: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        scale = 1.0 / math.sqrt(q.shape[-1])
        num_dst = q.shape[1]
        _, scores = _scores(q, k, e, src, dst, scale)
        row_max = _segment_max(scores, dst, num_dst).nan_to_num_(neginf=0.0)
        weights = scores.sub_(row_max.index_select(1, dst)).exp_()
        denom = weights.new_zeros(row_max.shape).index_add_(1, dst, weights)
        messages = v.index_select(1, src).add_(e).mul_(weights.unsqueeze(-1))
        out = q.new_zeros(q.shape).index_add_(1, dst, messages)
        del messages
        out.div_(denom.clamp_min(torch.finfo(denom.dtype).tiny).unsqueeze(-1))
        log_sum_exp = row_max + denom.log()  # -inf where a destination has no edge; never read then
        ctx.save_for_backward(q, k, v, e, src, dst, out, log_sum_exp)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, e, src, dst, out, log_sum_exp = ctx.saved_tensors
        scale = ctx.scale
        keys, scores = _scores(q, k, e, src, dst, scale)
        alpha = scores.sub_(log_sum_exp.index_select(1, dst)).exp_()  # (B, E, H) attention weights
        grad_out_dst = grad_out.index_select(1, dst)  # (B, E, H, C)
        grad_values = grad_out_dst * alpha.unsqueeze(-1)  # d out / d (v_j + e_ij)
        # d loss / d score: alpha * (<dout_i, v_j + e_ij> - <dout_i, out_i>)
        values = v.index_select(1, src).add_(e)
        grad_scores = torch.einsum("behc,behc->beh", grad_out_dst, values)
        del values
        grad_scores.sub_((grad_out * out).sum(-1).index_select(1, dst)).mul_(alpha).mul_(scale)
        del alpha
        grad_q = torch.zeros_like(q).index_add_(1, dst, keys.mul_(grad_scores.unsqueeze(-1)))
        del keys
        grad_keys = grad_out_dst.copy_(q.index_select(1, dst)).mul_(grad_scores.unsqueeze(-1))
        grad_k = torch.zeros_like(k).index_add_(1, src, grad_keys)
        grad_v = torch.zeros_like(v).index_add_(1, src, grad_values)
        grad_e = grad_keys.add_(grad_values).sum(0)
        return grad_q, grad_k, grad_v, grad_e, None, None


def graph_attention_torch(q: Tensor, k: Tensor, v: Tensor, e: Tensor, edge_index: Tensor) -> Tensor:
    """Edge-softmax attention with recomputation in backward; same arguments and result as the reference."""
    return _GraphAttention.apply(q, k, v, e, edge_index[0], edge_index[1])


GRAPH_ATTENTION_BACKENDS = {"torch": graph_attention_torch, "reference": graph_attention_reference}

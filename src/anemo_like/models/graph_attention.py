"""Graph attention: each destination node attends over its incoming edges (reference torch backend).

For destination i, head h, with incoming edges j -> i carrying edge embedding e_ij:
    a_ij = softmax_j( <q_i, k_j + e_ij> / sqrt(C) ),   out_i = sum_j a_ij (v_j + e_ij)
A destination without incoming edges gets zeros.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def graph_attention_reference(q: Tensor, k: Tensor, v: Tensor, e: Tensor, edge_index: Tensor) -> Tensor:
    """Edge-softmax attention in plain torch (runs on any device).

    Args:
        q: (B, N_dst, H, C) queries.
        k, v: (B, N_src, H, C) keys and values.
        e: (E, H, C) edge embeddings, shared over the batch.
        edge_index: (2, E) int64 [source; destination].

    Returns:
        (B, N_dst, H, C) attention output, dtype of ``q``.
    """
    src, dst = edge_index[0], edge_index[1]
    batch, num_dst, heads, _ = q.shape
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("behc,behc->beh", q.index_select(1, dst), k.index_select(1, src) + e) * scale
    # The softmax is shift-invariant, so the per-destination maximum only guards against overflow: no gradient.
    with torch.no_grad():
        row_max = scores.new_full((batch, num_dst, heads), -torch.inf)
        row_max.scatter_reduce_(1, dst.view(1, -1, 1).expand_as(scores), scores, reduce="amax", include_self=True)
    weights = torch.exp(scores - row_max.index_select(1, dst))
    denom = weights.new_zeros((batch, num_dst, heads)).index_add_(1, dst, weights)
    weights = weights / denom.index_select(1, dst)
    messages = weights.unsqueeze(-1) * (v.index_select(1, src) + e)
    return q.new_zeros(q.shape).index_add_(1, dst, messages.to(q.dtype))


GRAPH_ATTENTION_BACKENDS = {"reference": graph_attention_reference}

"""Every graph-attention backend equals a naive per-node, per-head loop (forward and gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from anemo_like.models.graph_attention import GRAPH_ATTENTION_BACKENDS


def naive_graph_attention(q, k, v, e, edge_index):
    """Per destination node and head: softmax over incoming edges of <q_i, k_j + e_ij>/sqrt(C), sum a (v_j + e_ij)."""
    src, dst = edge_index
    batch, num_dst, heads, channels = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for i in range(num_dst):
            incoming = (dst == i).nonzero().flatten()
            if incoming.numel() == 0:
                continue
            for h in range(heads):
                keys = k[b, src[incoming], h] + e[incoming, h]
                alpha = torch.softmax(keys @ q[b, i, h] / math.sqrt(channels), dim=0)
                out[b, i, h] = (alpha[:, None] * (v[b, src[incoming], h] + e[incoming, h])).sum(0)
    return out


def random_problem(seed: int, *, num_src=9, num_dst=7, edges=30, batch=2, heads=3, channels=5):
    g = torch.Generator().manual_seed(seed)
    dst = torch.sort(torch.randint(0, num_dst - 1, (edges,), generator=g)).values  # last dst has no edges
    src = torch.randint(0, num_src, (edges,), generator=g)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    return (
        randn(batch, num_dst, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(edges, heads, channels),
        torch.stack([src, dst]),
    )


BACKENDS = sorted(GRAPH_ATTENTION_BACKENDS)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backend_equals_naive_loop_forward_and_backward(backend: str, seed: int) -> None:
    q, k, v, e, edge_index = random_problem(seed)
    out = GRAPH_ATTENTION_BACKENDS[backend](q, k, v, e, edge_index)
    expected = naive_graph_attention(q, k, v, e, edge_index)
    torch.testing.assert_close(out, expected)
    assert torch.all(out[:, -1] == 0), "a destination without incoming edges must get zeros"

    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), (q, k, v, e))
    expected_grads = torch.autograd.grad((expected * weights).sum(), (q, k, v, e))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_scores_do_not_overflow(backend: str) -> None:
    q, k, v, e, edge_index = random_problem(3)
    with torch.no_grad():
        q.mul_(200.0)
    out = GRAPH_ATTENTION_BACKENDS[backend](q, k, v, e, edge_index)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, naive_graph_attention(q, k, v, e, edge_index))


def test_torch_backend_passes_gradcheck_with_unsorted_edges() -> None:
    q, k, v, e, edge_index = random_problem(4, num_src=5, num_dst=4, edges=12, batch=1, heads=2, channels=3)
    shuffled = edge_index[:, torch.randperm(edge_index.shape[1], generator=torch.Generator().manual_seed(0))]
    backend = GRAPH_ATTENTION_BACKENDS["torch"]
    assert torch.autograd.gradcheck(lambda *t: backend(*t, shuffled), (q, k, v, e))

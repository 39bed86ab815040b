"""Every graph-attention backend equals a naive per-node, per-head loop (forward and gradients), however the
``torch`` backend cuts the edges into blocks."""

from __future__ import annotations

import math

import pytest
import torch

from anemo_like.models.ops import graph_attention
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import GRAPH_ATTENTION_BACKENDS

pytestmark = pytest.mark.equivalence


def naive_graph_attention(q, k, v, edge_attr, weight, bias, edge_index):
    """Per destination node and head: softmax over incoming edges of <q_i, k_j + e_ij>/sqrt(C), sum a (v_j + e_ij)."""
    src, dst = edge_index
    batch, num_dst, heads, channels = q.shape
    e = (edge_attr @ weight.T + bias).view(-1, heads, channels)
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


def random_problem(seed: int, *, num_src=9, num_dst=7, edges=30, batch=2, heads=3, channels=5, attr=4):
    """Tensors (q, k, v, edge_attr, weight, bias) in float64 and a destination-sorted edge_index; the last
    destination has no incoming edge."""
    g = torch.Generator().manual_seed(seed)
    dst = torch.sort(torch.randint(0, num_dst - 1, (edges,), generator=g)).values
    src = torch.randint(0, num_src, (edges,), generator=g)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)

    tensors = (
        randn(batch, num_dst, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(edges, attr),
        randn(heads * channels, attr),
        randn(heads * channels),
    )
    return tensors, torch.stack([src, dst])


def run_backend(backend: str, tensors, edge_index, min_blocks: int = 1):
    q = tensors[0]
    edges = SortedEdges(edge_index, q.shape[1])
    return GRAPH_ATTENTION_BACKENDS[backend](*tensors, edges, min_blocks=min_blocks)


BACKENDS = ["reference", "torch"]  # triton: tests/test_triton_graph_attention.py (in the interpreter)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_backend_equals_naive_loop_forward_and_backward(backend: str, seed: int) -> None:
    tensors, edge_index = random_problem(seed)
    out = run_backend(backend, tensors, edge_index)
    expected = naive_graph_attention(*tensors, edge_index)
    torch.testing.assert_close(out, expected)
    assert torch.all(out[:, -1] == 0), "a destination without incoming edges must get zeros"

    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    expected_grads = torch.autograd.grad((expected * weights).sum(), tensors)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("min_blocks", [2, 3, 5, 30, 100])
def test_torch_backend_in_blocks_equals_reference(min_blocks: int) -> None:
    tensors, edge_index = random_problem(5, num_src=11, num_dst=13, edges=60)
    out = run_backend("torch", tensors, edge_index, min_blocks)
    expected = run_backend("reference", tensors, edge_index)
    torch.testing.assert_close(out, expected)
    weights = torch.randn_like(out)
    grads = torch.autograd.grad((out * weights).sum(), tensors)
    expected_grads = torch.autograd.grad((expected * weights).sum(), tensors)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)


def test_block_size_bound_follows_tensor_shape() -> None:
    """With a tiny element budget every block is small; a destination with more edges than the bound stays whole."""
    elements = 2 * 3 * 5 * 4  # 4 edges per block at B=2, H=3, C=5
    tensors, edge_index = random_problem(6, num_dst=9, edges=40)
    edges = SortedEdges(edge_index, 9)
    out = graph_attention.graph_attention_torch(*tensors, edges, block_elements=elements)
    assert graph_attention.edges_per_block(2, 3, 5, elements) == 4
    blocks = edges.blocks(4, 1)
    counts = torch.bincount(edge_index[1], minlength=9)
    for block in blocks:
        size = block.edge_stop - block.edge_start
        assert size <= 4 or block.dst_stop - block.dst_start == 1
        assert size == int(counts[block.dst_start : block.dst_stop].sum())
    torch.testing.assert_close(out, run_backend("reference", tensors, edge_index))


def test_blocks_cover_every_edge_once_at_destination_boundaries() -> None:
    _, edge_index = random_problem(7, num_dst=20, edges=200)
    edges = SortedEdges(edge_index, 20)
    for max_edges, min_blocks in [(1, 1), (16, 1), (64, 3), (1000, 7), (1000, 50)]:
        blocks = edges.blocks(max_edges, min_blocks)
        assert [b.edge_start for b in blocks[1:]] == [b.edge_stop for b in blocks[:-1]]
        assert blocks[0].edge_start == 0 and blocks[-1].edge_stop == 200
        for block in blocks:
            dst = edge_index[1, block.edge_start : block.edge_stop]
            assert int(dst.min()) >= block.dst_start and int(dst.max()) < block.dst_stop
            torch.testing.assert_close(block.dst_local + block.dst_start, dst)
        assert len(blocks) >= min(min_blocks, 19)
    assert edges.planned_min_blocks() == [1, 3, 7, 50]


def test_unsorted_edges_are_refused() -> None:
    _, edge_index = random_problem(8)
    with pytest.raises(ValueError, match="sorted by destination"):
        SortedEdges(edge_index.flip(1), 7)


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_scores_do_not_overflow(backend: str) -> None:
    tensors, edge_index = random_problem(3)
    with torch.no_grad():
        tensors[0].mul_(200.0)
    out = run_backend(backend, tensors, edge_index)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, naive_graph_attention(*tensors, edge_index))


def test_torch_backend_passes_gradcheck_across_blocks() -> None:
    tensors, edge_index = random_problem(4, num_src=5, num_dst=6, edges=14, batch=1, heads=2, channels=3, attr=2)
    edges = SortedEdges(edge_index, 6)
    backend = GRAPH_ATTENTION_BACKENDS["torch"]
    assert torch.autograd.gradcheck(lambda *t: backend(*t, edges, min_blocks=3), tensors)

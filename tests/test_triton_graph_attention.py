"""The ``triton`` graph-attention backend equals the ``reference`` backend (forward and every gradient), passes
``torch.library.opcheck``, builds its index tensors once per edge set and says when it cannot run.

TRITON_INTERPRET (runs the kernels on CPU tensors in triton's interpreter): triton 3.9 reads it whenever
``triton.jit`` wraps a function, and triton wraps its own language library (``tl.sum``, ``tl.zeros``, ...) when
``import triton`` runs. So the variable has to be set before triton is first imported in the process; with it set
later, an interpreted kernel calls a compiled ``tl.zeros`` and fails. In a pytest session triton is imported before
this module is even collected (conftest imports the graph code, which imports torch_geometric, which imports
triton), so setting the variable at the top of this module would be too late, and would leak into every other
test of the session. Hence ``test_kernels_in_interpreter_subprocess`` runs this file again in a child pytest
started with TRITON_INTERPRET=1 in its environment, i.e. set before anything is imported; the kernel tests (fixture
``interpreter``) skip in the parent and run in the child, where the subprocess test skips.
``TRITON_INTERPRET=1 pytest tests/test_triton_graph_attention.py`` runs them directly. The CUDA compile check needs
compiled-mode kernels, so it runs in the parent only; ``test_unavailable_reason`` runs in both.
"""

from __future__ import annotations

import gc
import math
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from anemo_like.models.ops import triton_graph_attention as tga
from anemo_like.models.ops import triton_kernels as kernels
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import graph_attention_reference

pytestmark = pytest.mark.equivalence

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
"""This process started with TRITON_INTERPRET=1, so triton and the kernels were wrapped for the interpreter."""

CPU = torch.device("cpu")


@pytest.fixture
def interpreter() -> None:
    """Kernel launches need the interpreter, i.e. the child process of the subprocess test."""
    if not INTERPRETED:
        pytest.skip("launches kernels: runs in the TRITON_INTERPRET=1 child of test_kernels_in_interpreter_subprocess")


def random_graph(seed: int, num_dst: int, num_src: int, hub_degree: int = 70) -> torch.Tensor:
    """Destination-sorted (2, E) edges: destination 0 and every 7th one have no edge, destination num_dst // 2 has
    ``hub_degree``, the others 0 to 5; the last 3 sources have no outgoing edge."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.randint(0, 6, (num_dst,), generator=g)
    degree[::7] = 0
    degree[num_dst // 2] = hub_degree
    dst = torch.repeat_interleave(torch.arange(num_dst), degree)
    src = torch.randint(0, num_src - 3, (dst.numel(),), generator=g)
    return torch.stack([src, dst])


def random_tensors(seed: int, edge_index, num_dst, num_src, *, batch, heads, channels, attr=4, bias=True):
    """(q, k, v, edge_attr, weight, bias or None) in float64."""
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return (
        randn(batch, num_dst, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(edge_index.shape[1], attr),
        randn(heads * channels, attr) / math.sqrt(attr),
        randn(heads * channels) if bias else None,
    )


def leaves(tensors, dtype: torch.dtype) -> list[torch.Tensor | None]:
    return [None if t is None else t.to(dtype).requires_grad_() for t in tensors]


def outputs_and_gradients(backend, tensors, edges: SortedEdges, seed: int):
    """Attention output and the gradients of a random linear function of it w.r.t. every tensor given."""
    out = backend(*tensors, edges)
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    inputs = [t for t in tensors if t is not None]
    return out, torch.autograd.grad((out.double() * weights).sum(), inputs)


@pytest.mark.parametrize(
    "num_dst, num_src, batch, heads, channels, bias",
    [(30, 24, 2, 3, 5, True), (40, 32, 1, 3, 12, False)],
    ids=["B2-H3-C5", "B1-H3-C12-nobias"],
)
def test_fp32_forward_and_gradients_equal_reference(
    interpreter, num_dst, num_src, batch, heads, channels, bias
) -> None:
    """q, k, v, e (through autograd weight, bias, edge_attr) against the reference evaluated in float64 on the same
    fp32 values, within 1e-5 relative (atol 1e-6 of the largest magnitude)."""
    edge_index = random_graph(0, num_dst, num_src)
    edges = SortedEdges(edge_index, num_dst)
    tensors = random_tensors(1, edge_index, num_dst, num_src, batch=batch, heads=heads, channels=channels, bias=bias)
    out, grads = outputs_and_gradients(tga.graph_attention_triton, leaves(tensors, torch.float32), edges, 2)
    want, want_grads = outputs_and_gradients(graph_attention_reference, leaves(tensors, torch.float64), edges, 2)
    assert out.dtype == torch.float32
    no_edges = torch.bincount(edge_index[1], minlength=num_dst) == 0
    assert torch.all(out[:, no_edges] == 0), "a destination without incoming edges must get zeros"
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        expected = expected.detach().float()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max()))


def uneven_graph(num_dst: int, num_src: int) -> torch.Tensor:
    """Destination-sorted (2, E) edges of very uneven degree: most destinations none or one, one 150, one every
    source once (E about 270)."""
    degree = torch.zeros(num_dst, dtype=torch.int64)
    degree[1::3] = 1
    degree[num_dst // 3] = 150
    degree[-1] = num_src
    dst = torch.repeat_interleave(torch.arange(num_dst), degree)
    g = torch.Generator().manual_seed(21)
    src = torch.randint(0, num_src, (dst.numel(),), generator=g)
    src[-num_src:] = torch.arange(num_src)
    return torch.stack([src, dst])


@pytest.mark.parametrize("tile_elements", [1, 64, 4096], ids=lambda t: f"tile{t}")
@pytest.mark.parametrize("heads, channels", [(1, 8), (5, 3), (16, 4)], ids=lambda n: str(n))
def test_block_sizes_heads_widths_and_uneven_degrees(interpreter, monkeypatch, tile_elements, heads, channels):
    """Every head count and width (powers of two or not), one edge per step up to a full tile, on a graph whose
    degrees run from 0 to 150: fp32 within 1e-5 of the float64 reference, forward and every gradient."""
    monkeypatch.setattr(kernels, "TILE_ELEMENTS", tile_elements)
    num_dst, num_src = 60, 48
    edge_index = uneven_graph(num_dst, num_src)
    edges = SortedEdges(edge_index, num_dst)
    tensors = random_tensors(22, edge_index, num_dst, num_src, batch=2, heads=heads, channels=channels)
    out, grads = outputs_and_gradients(tga.graph_attention_triton, leaves(tensors, torch.float32), edges, 23)
    want, want_grads = outputs_and_gradients(graph_attention_reference, leaves(tensors, torch.float64), edges, 23)
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        expected = expected.detach().float()
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6 * float(expected.abs().max()))


def test_launch_config_keeps_a_tile_within_its_elements() -> None:
    """D's heads (16 x 64 channels): 4 edges a step, 8 warps; a narrow model 16 edges; a row above the tile 1."""
    assert kernels.launch_config(16, 64) == {"BLOCK_E": 4, "BLOCK_H": 16, "BLOCK_C": 64, "num_warps": 8,
                                             "enable_fp_fusion": True}  # fmt: skip
    assert kernels.launch_config(3, 5)["BLOCK_E"] == kernels.MAX_EDGES_PER_STEP
    assert kernels.launch_config(16, 512)["BLOCK_E"] == 1


LOW_PRECISION_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
"""rtol, and atol relative to the largest magnitude, against the float64 reference on the same rounded inputs."""


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_low_precision_close_to_reference(interpreter, dtype: torch.dtype) -> None:
    num_dst, num_src = 30, 24
    edge_index = random_graph(3, num_dst, num_src)
    edges = SortedEdges(edge_index, num_dst)
    tensors = random_tensors(4, edge_index, num_dst, num_src, batch=1, heads=2, channels=12)
    rounded = [t.to(dtype).double() for t in tensors]
    out, grads = outputs_and_gradients(tga.graph_attention_triton, leaves(tensors, dtype), edges, 5)
    want, want_grads = outputs_and_gradients(graph_attention_reference, leaves(rounded, torch.float64), edges, 5)
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    tolerance = LOW_PRECISION_TOLERANCE[dtype]
    for got, expected in zip((out.detach(), *grads), (want.detach(), *want_grads), strict=True):
        torch.testing.assert_close(got.double(), expected, rtol=tolerance, atol=tolerance * float(expected.abs().max()))


def test_custom_ops_pass_opcheck(interpreter) -> None:
    """Schema, fake (meta) kernels, autograd registration and AOT dispatch of both custom ops."""
    num_dst, num_src = 6, 5
    edge_index = random_graph(6, num_dst, num_src, hub_degree=4)
    index = tga.attention_index(SortedEdges(edge_index, num_dst), CPU, num_src).tensors()
    q, k, v, _, _, _ = random_tensors(7, edge_index, num_dst, num_src, batch=1, heads=2, channels=3)
    e = torch.randn(edge_index.shape[1], 2, 3, generator=torch.Generator().manual_seed(8))
    q, k, v, e = (t.float().requires_grad_() for t in (q, k, v, e))
    torch.library.opcheck(tga.graph_attention_op, (q, k, v, e, *index))
    out, log_sum_exp = tga.graph_attention_op(q, k, v, e, *index)
    assert not log_sum_exp.requires_grad
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9))
    saved = (t.detach() for t in (q, k, v, e, out, log_sum_exp))
    torch.library.opcheck(tga.graph_attention_backward_op, (grad_out, *saved, *index))


def test_torch_compile_traces_through_the_op(interpreter) -> None:
    """With the index cache warm, the whole call (edge embedding, custom op, its backward) is one graph."""
    num_dst, num_src = 10, 8
    edge_index = random_graph(14, num_dst, num_src, hub_degree=20)
    edges = SortedEdges(edge_index, num_dst)
    tensors = leaves(random_tensors(15, edge_index, num_dst, num_src, batch=1, heads=3, channels=5), torch.float32)
    eager, eager_grads = outputs_and_gradients(tga.graph_attention_triton, tensors, edges, 16)
    compiled = torch.compile(tga.graph_attention_triton, backend="aot_eager", fullgraph=True)
    out, grads = outputs_and_gradients(compiled, tensors, edges, 16)
    for got, expected in zip((out, *grads), (eager, *eager_grads), strict=True):
        torch.testing.assert_close(got, expected)


def test_index_cache_is_built_once_per_edge_set(interpreter, monkeypatch) -> None:
    builds = []
    build = tga._build_attention_index
    monkeypatch.setattr(tga, "_build_attention_index", lambda *args: builds.append(args[2]) or build(*args))
    num_dst, num_src = 12, 10
    edge_index = random_graph(10, num_dst, num_src, hub_degree=20)
    edges = SortedEdges(edge_index, num_dst)
    tensors = leaves(random_tensors(11, edge_index, num_dst, num_src, batch=1, heads=2, channels=3), torch.float32)
    with torch.no_grad():
        tga.graph_attention_triton(*tensors, edges)
    tga.graph_attention_triton(*tensors, edges).sum().backward()
    assert len(builds) == 1
    index = tga.attention_index(edges, CPU, num_src)
    assert tga.attention_index(edges, CPU, num_src) is index and len(builds) == 1
    counts = torch.bincount(edge_index[1], minlength=num_dst)
    torch.testing.assert_close(index.dst_ptr, torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]))
    assert torch.all(index.src[index.src_order].diff() >= 0)
    torch.testing.assert_close(index.src_order_dst, edge_index[1, index.src_order])
    assert torch.all(index.src_ptr[num_src - 3 :] == edge_index.shape[1]), "the last 3 sources have no edge"
    tga.attention_index(edges, CPU, num_src + 1)  # another source count is another entry
    assert len(builds) == 2
    edges_alive = weakref.ref(edges)
    del edges
    gc.collect()
    assert edges_alive() is None, "the cache must not keep an edge set alive"


def test_index_refuses_nodes_out_of_range() -> None:
    edge_index = random_graph(17, 8, 7, hub_degree=3)
    with pytest.raises(ValueError, match=r"a source index outside \[0, 3\)"):
        tga.attention_index(SortedEdges(edge_index, 8), CPU, 3)


def test_unavailable_reason(monkeypatch) -> None:
    """Launches no kernel: runs with and without the interpreter."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tga.triton_unavailable_reason(CPU) is None
    monkeypatch.delenv("TRITON_INTERPRET")
    reason = "tensors are on cpu and TRITON_INTERPRET=1 is not set: Triton kernels need a CUDA GPU"
    assert tga.triton_unavailable_reason(CPU) == reason
    assert tga.triton_unavailable_reason(torch.device("cuda")) is None
    edge_index = random_graph(12, 8, 7, hub_degree=3)
    tensors = leaves(random_tensors(13, edge_index, 8, 7, batch=1, heads=2, channels=3), torch.float32)
    with pytest.raises(RuntimeError, match=f"graph attention backend 'triton' cannot run: {reason}"):
        tga.graph_attention_triton(*tensors, SortedEdges(edge_index, 8))
    monkeypatch.setattr(tga, "triton", None)
    assert (
        tga.triton_unavailable_reason(torch.device("cuda"))
        == "triton is not installed (pip install anemo-like[triton])"
    )


def argument_type(name: str, dtype: str) -> str:
    """Triton type of a kernel argument: block sizes constexpr, other lower-case names int32 but the fp32 scale;
    index arrays int64, statistics and the grad_e buffer fp32, node and edge tensors ``dtype``."""
    if name.startswith("BLOCK_"):
        return "constexpr"
    if name.islower():
        return "fp32" if name == "scale" else "i32"
    if name in {"DST_PTR", "SRC", "SRC_PTR", "SRC_ORDER", "SRC_ORDER_DST"}:
        return "*i64"
    return "*fp32" if name in {"LSE", "DELTA", "GRAD_EMB"} else f"*{dtype}"


@pytest.mark.parametrize("heads, channels", [(3, 12), (16, 64)], ids=["H3-C12", "D-H16-C64"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_kernels_compile_for_cuda(dtype: str, heads: int, channels: int) -> None:
    """The interpreter is lenient: the three kernels must also go through triton's compiler, down to a cubin for
    sm_80 (no GPU needed), with a head count and a head width that are not powers of two."""
    if INTERPRETED:
        pytest.skip("needs compiled-mode kernels: runs without TRITON_INTERPRET")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    config = kernels.launch_config(heads, channels)
    blocks = {name: value for name, value in config.items() if name.startswith("BLOCK_")}
    options = {name: value for name, value in config.items() if name not in blocks}
    for kernel in (kernels.forward_kernel, kernels.backward_dst_kernel, kernels.backward_src_kernel):
        signature = {name: argument_type(name, dtype) for name in kernel.arg_names}
        compiled = triton.compile(
            ASTSource(kernel, signature, constexprs=blocks),
            target=GPUTarget("cuda", 80, 32),
            options=options,
        )
        assert compiled.asm["cubin"]


def test_kernels_in_interpreter_subprocess() -> None:
    """Runs this file in a child pytest with TRITON_INTERPRET=1 set before anything is imported (module docstring);
    without conftest, whose fixtures nothing here uses, which spares the child the session's imports."""
    if INTERPRETED:
        pytest.skip("this is the TRITON_INTERPRET=1 process")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider", "--noconftest"],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    report = child.stdout + child.stderr
    assert child.returncode == 0, f"kernel tests under TRITON_INTERPRET=1 failed:\n{report[-6000:]}"
    assert " passed" in report
    print(report.strip().splitlines()[-1])

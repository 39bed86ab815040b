"""The GPU paths on a real CUDA device (marker ``gpu``; every test skips without CUDA): the Triton kernels compiled
(not interpreted) against the float64 reference, the custom op under torch.compile, SDPA window attention, the
model on CUDA against CPU, torch.compile module lists, a captured CUDA-graph training step with fused AdamW, the
CUDA memory snapshot, a CPU checkpoint run on CUDA, an NCCL process group of one and anemo-infer's captured forward.

Run by ``benchmarks/gpu/gpu_check.py`` (docs/gpu.md), or ``pytest -m gpu tests/test_gpu.py`` on a CUDA machine.
"""

from __future__ import annotations

import copy
import pickle
import socket

import pytest
import torch
import torch.distributed as dist
from conftest import latlon_graph
from test_model import make_model
from test_triton_graph_attention import LOW_PRECISION_TOLERANCE, leaves

from anemo_like.config.schema import ModelConfig
from anemo_like.diagnostics.snapshot import SNAPSHOT_FILE
from anemo_like.distributed.environment import LaunchEnvironment, init_process_group
from anemo_like.inference import load_inference_checkpoint
from anemo_like.models.ops import triton_graph_attention as tga
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import graph_attention_reference
from anemo_like.models.ops.window_attention import band_attention, reference_attention, window_attention
from anemo_like.runtime.compile import compile_modules
from anemo_like.runtime.inference_environment import GRAPH_BACKEND_VARIABLE
from anemo_like.training.trainer import Trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]
CUDA = torch.device("cuda")

FP32_TOLERANCE = 1e-4
"""Compiled kernels in fp32 against float64: rtol, and atol relative to the largest magnitude. The kernels sum up to
1e5 edges of a hub node in fp32 (random-sign rounding grows like sqrt(n) * 6e-8, about 2e-5) and triton's exp is an
approximate exp2 (a few ulp); the interpreter test's 1e-5 is for graphs of under 100 edges."""

GRAPHS = {
    "tiny": (30, 24, 2, 70),
    "2e5-edges": (20_000, 16_000, 5, 5_000),
    "1e7-edges": (1_000_000, 500_000, 5, 100_000),
}
"""Name -> (destinations, sources, mean degree, hub degree): every 7th destination has no edge, destination
N_dst // 2 has the hub degree, the others 0 to 2 x mean; the last 3 sources have no outgoing edge."""
SHAPES = {"tiny": (2, 3, 5), "2e5-edges": (1, 4, 12), "1e7-edges": (1, 2, 8)}
"""Name -> (batch, heads, channels): channels 5 and 12 are padded to a power of two in the kernels."""


def skewed_graph(num_dst: int, num_src: int, mean_degree: int, hub_degree: int, seed: int) -> torch.Tensor:
    """Destination-sorted (2, E) edges with isolated destinations and one hub (see ``GRAPHS``), on the CPU."""
    g = torch.Generator().manual_seed(seed)
    degree = torch.randint(0, 2 * mean_degree + 1, (num_dst,), generator=g)
    degree[::7] = 0
    degree[num_dst // 2] = hub_degree
    dst = torch.repeat_interleave(torch.arange(num_dst), degree)
    return torch.stack([torch.randint(0, num_src - 3, (dst.numel(),), generator=g), dst])


def cuda_tensors(seed: int, edges: int, num_dst: int, num_src: int, batch: int, heads: int, channels: int, attr=4):
    """(q, k, v, edge_attr, weight, bias) in float64 on CUDA."""
    g = torch.Generator(device=CUDA).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=CUDA, dtype=torch.float64)

    return (
        randn(batch, num_dst, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(batch, num_src, heads, channels),
        randn(edges, attr),
        randn(heads * channels, attr) / attr**0.5,
        randn(heads * channels),
    )


def outputs_and_gradients(backend, tensors, edges: SortedEdges, seed: int):
    """Attention output and the gradients of a random linear function of it w.r.t. every tensor given (CUDA)."""
    out = backend(*tensors, edges)
    weights = torch.randn(out.shape, generator=torch.Generator(CUDA).manual_seed(seed), device=CUDA)
    return out, torch.autograd.grad((out.double() * weights.double()).sum(), tensors)


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    """``got`` within ``tolerance`` relative, and ``tolerance`` times the largest |expected| absolute (on the CPU)."""
    expected = expected.detach().double().cpu()
    atol = tolerance * float(expected.abs().max())
    torch.testing.assert_close(got.detach().double().cpu(), expected, rtol=tolerance, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("graph", list(GRAPHS))
def test_compiled_triton_kernels_equal_reference(graph: str, dtype: torch.dtype) -> None:
    """Forward and every gradient (q, k, v, and edge features, weight, bias through the embedding) against the float64
    reference on the same rounded inputs; destinations without edges get zeros."""
    num_dst, num_src, mean_degree, hub_degree = GRAPHS[graph]
    edge_index = skewed_graph(num_dst, num_src, mean_degree, hub_degree, seed=0).to(CUDA)
    edges = SortedEdges(edge_index, num_dst)
    batch, heads, channels = SHAPES[graph]
    tensors = cuda_tensors(1, edge_index.shape[1], num_dst, num_src, batch, heads, channels)
    rounded = [t.to(dtype).double() for t in tensors]
    out, grads = outputs_and_gradients(tga.graph_attention_triton, leaves(tensors, dtype), edges, 2)
    want, want_grads = outputs_and_gradients(graph_attention_reference, leaves(rounded, torch.float64), edges, 2)
    assert out.device.type == "cuda" and out.dtype == dtype and all(g.dtype == dtype for g in grads)
    no_edges = torch.bincount(edge_index[1], minlength=num_dst) == 0
    assert bool(no_edges.any()) and bool((out[:, no_edges] == 0).all()), "isolated destinations must get zeros"
    tolerance = FP32_TOLERANCE if dtype == torch.float32 else LOW_PRECISION_TOLERANCE[dtype]
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        assert_close_to_scale(got, expected, tolerance)


def test_custom_op_under_torch_compile_with_inductor() -> None:
    """The whole call (edge embedding, custom op, its backward) compiles as one inductor graph on CUDA and gives
    the eager result (the embedding's matmul may be fused differently: fp32 tolerance)."""
    num_dst, num_src = 2_000, 1_500
    edge_index = skewed_graph(num_dst, num_src, 4, 300, seed=3).to(CUDA)
    edges = SortedEdges(edge_index, num_dst)
    tensors = leaves(cuda_tensors(4, edge_index.shape[1], num_dst, num_src, 1, 4, 16), torch.float32)
    eager, eager_grads = outputs_and_gradients(tga.graph_attention_triton, tensors, edges, 5)  # warms the index
    torch._dynamo.reset()
    compiled = torch.compile(tga.graph_attention_triton, fullgraph=True)
    out, grads = outputs_and_gradients(compiled, tensors, edges, 5)
    for got, expected in zip((out, *grads), (eager, *eager_grads), strict=True):
        assert_close_to_scale(got, expected, FP32_TOLERANCE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_sdpa_window_attention_equals_reference(dtype: torch.dtype) -> None:
    """Band SDPA at the reference processor size (2,562 nodes, 16 heads of 16, window 512) against the dense-mask
    reference in fp32 on the same rounded inputs, forward and input gradients; flash-attn is absent here, so that
    backend falls back to SDPA."""
    g = torch.Generator(device=CUDA).manual_seed(0)
    q, k, v = (torch.randn(1, 16, 2562, 16, generator=g, device=CUDA).to(dtype).requires_grad_() for _ in range(3))
    grad_out = torch.randn(q.shape, generator=g, device=CUDA)
    out = band_attention(q, k, v, window=512)
    grads = torch.autograd.grad((out.float() * grad_out).sum(), (q, k, v))
    wide = [t.detach().float().requires_grad_() for t in (q, k, v)]
    want = reference_attention(*wide, window=512)
    want_grads = torch.autograd.grad((want * grad_out).sum(), wide)
    tolerance = FP32_TOLERANCE if dtype == torch.float32 else LOW_PRECISION_TOLERANCE[dtype]
    for got, expected in zip((out, *grads), (want, *want_grads), strict=True):
        assert got.dtype == dtype
        assert_close_to_scale(got, expected, tolerance)
    fallback = window_attention(q, k, v, window=512, backend="flash_attention")
    torch.testing.assert_close(fallback, out, rtol=0, atol=0)


@pytest.fixture(scope="module")
def graph():
    """A 24x48 lat/lon grid on a twice-refined icosahedron (1,152 grid and 162 mesh nodes)."""
    return latlon_graph(24, 48, 2)


def forward_backward(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's output and all its parameters' gradients of a fixed function of it, flattened into one vector
    (a single gradient can be ~0 in exact arithmetic, e.g. a key bias under the shift-invariant softmax, so each is
    compared at the scale of all of them), on the CPU."""
    y = model(x)
    y.square().mean().backward()
    return y.detach().cpu(), torch.cat([p.grad.detach().flatten() for p in model.parameters()]).cpu()


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("processor", ["graphtransformer", "transformer"])
def test_model_on_cuda_equals_cpu(graph, processor: str, backend: str) -> None:
    """fp32 forward and every parameter gradient on CUDA against the CPU model with the ``torch`` backend: the same
    maths summed in another order (blocked and atomic sums, fused kernels), hence ``FP32_TOLERANCE``."""
    config = {"processor": {"type": processor, "num_layers": 2, "window_size": 64}}
    cpu_model = make_model(graph, graph_attention_backend="torch", **config)
    cuda_model = make_model(graph, graph_attention_backend=backend, **config).to(CUDA)
    x = torch.randn(2, 2, graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(1))
    want, want_grads = forward_backward(cpu_model, x)
    got, grads = forward_backward(cuda_model, x.to(CUDA))
    assert all(b.device.type == "cuda" for b in cuda_model.buffers())
    assert_close_to_scale(got, want, FP32_TOLERANCE)
    assert_close_to_scale(grads, want_grads, FP32_TOLERANCE)


def test_compiled_module_list_equals_eager_on_cuda(graph) -> None:
    """``model.compile`` of the MLP and the whole graph-transformer block (Triton backend: the custom op traced)
    on CUDA with inductor: same output and gradients as eager, and every class timed at its first call."""
    eager = make_model(graph, graph_attention_backend="triton").to(CUDA)
    compiled = copy.deepcopy(eager)
    classes = ["anemo_like.models.mlp.MLP", "anemo_like.models.block.GraphTransformerBlock"]
    torch._dynamo.reset()
    entries = ModelConfig.model_validate({"compile": [{"module": c} for c in classes]}).compile
    report = compile_modules(compiled, entries, recompile_limit=16)
    x = torch.randn(2, 2, graph["data"].num_nodes, 5, device=CUDA, generator=torch.Generator(CUDA).manual_seed(2))
    want, want_grads = forward_backward(eager, x)
    got, grads = forward_backward(compiled, x)
    assert all(report.modules[c] for c in classes) and not report.eager
    assert classes[1] in report.first_call_seconds  # the MLPs inside a compiled block run inlined in its graph
    assert_close_to_scale(got, want, FP32_TOLERANCE)
    assert_close_to_scale(grads, want_grads, FP32_TOLERANCE)


RUN = ["system.hardware.accelerator=cuda", "diagnostics.plots=false", "training.val_every_n_steps=1000"]


def test_cuda_graph_training_step_replays_the_eager_step(tmp_path, compose_run) -> None:
    """A whole training step (forward, loss, backward, clipping, fused AdamW) captured after 2 eager steps: its
    replays give the losses an eager twin gets on the same batches, within fp32 summation-order noise amplified by
    Adam's normalised updates over 6 steps."""
    overrides = [*RUN, "training.cuda_graph_warmup=2", "training.max_steps=6"]
    captured = Trainer(compose_run(tmp_path / "graph", [*overrides, "training.cuda_graphs=true"]))
    eager = Trainer(compose_run(tmp_path / "eager", overrides))
    assert captured.optimizer.defaults["fused"] and captured.optimizer.defaults["capturable"]
    batches = iter(captured.train_loader(0))
    losses: dict[str, list[float]] = {"captured": [], "eager": []}
    for _ in range(6):
        batch = captured.prepare_train_batch(next(batches))
        for name, trainer in (("captured", captured), ("eager", eager)):
            losses[name].append(float(trainer.train_step(batch)))
            trainer.step += 1
    assert captured.captured is not None and eager.captured is None
    assert len(set(losses["captured"])) == 6, f"replays must recompute the loss: {losses['captured']}"
    torch.testing.assert_close(losses["captured"], losses["eager"], rtol=1e-3, atol=0)


def test_bf16_training_with_cuda_graphs_and_memory_snapshot(tmp_path, compose_run) -> None:
    """``anemo-train``'s loop on CUDA in bf16-mixed with a captured step: finite losses, and the allocator history
    of steps 1 to 3 written as a pickled snapshot (segments and traces)."""
    overrides = [
        *RUN,
        "training.precision=bf16-mixed",
        "training.max_steps=8",
        "diagnostics.memory_snapshot.enabled=true",
        "diagnostics.memory_snapshot.warmup=1",
        "diagnostics.memory_snapshot.steps=2",
    ]
    outputs = Trainer(compose_run(tmp_path / "snapshot", overrides)).fit()
    snapshot = outputs.run_dir / "memory_snapshot" / SNAPSHOT_FILE
    with snapshot.open("rb") as f:
        recorded = pickle.load(f)
    assert recorded["segments"] and any(recorded["device_traces"])
    graphs = [*RUN, "training.precision=bf16-mixed", "training.max_steps=8", "training.cuda_graphs=true"]
    graphs += ["training.cuda_graph_warmup=3"]
    trainer = Trainer(compose_run(tmp_path / "graphs", graphs))
    trained = trainer.fit()
    assert trainer.captured is not None
    assert trained.validation is not None


def test_cpu_checkpoint_runs_on_cuda(tmp_path, compose_run, monkeypatch) -> None:
    """An inference checkpoint written by a CPU run, loaded onto CUDA (every buffer and edge index there), gives the
    CPU forecast with the ``torch`` and the ``triton`` backend; its training checkpoint resumes on CUDA."""
    cpu_run = ["system.hardware.accelerator=cpu", "diagnostics.plots=false", "training.max_steps=2"]
    outputs = Trainer(compose_run(tmp_path / "cpu", cpu_run)).fit()
    x = torch.randn(1, 2, 2048, load_inference_checkpoint(outputs.inference_checkpoint).model.layout.num_input)
    with torch.no_grad():
        want = load_inference_checkpoint(outputs.inference_checkpoint).model(x)
        for backend in ("torch", "triton"):
            monkeypatch.setenv(GRAPH_BACKEND_VARIABLE, backend)
            model = load_inference_checkpoint(outputs.inference_checkpoint, device="cuda").model
            assert all(t.device.type == "cuda" for t in (*model.parameters(), *model.buffers()))
            assert_close_to_scale(model(x.to(CUDA)), want, FP32_TOLERANCE)
    resume = [*RUN, f"training.resume={outputs.training_checkpoint}", "training.max_steps=4"]
    resumed = Trainer(compose_run(tmp_path / "cuda", resume))
    assert resumed.step == 2
    state = next(iter(resumed.optimizer.state.values()))
    assert state["exp_avg"].device.type == "cuda"
    assert resumed.fit().validation is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nccl_process_group_of_one() -> None:
    """``init_process_group`` on CUDA picks NCCL; an all-reduce over the group of one returns the tensor."""
    env = LaunchEnvironment(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port())
    init_process_group(env, CUDA, timeout_minutes=1)
    try:
        assert dist.get_backend() == "nccl"
        tensor = torch.arange(4.0, device=CUDA)
        dist.all_reduce(tensor)
        torch.cuda.synchronize()
        torch.testing.assert_close(tensor, torch.arange(4.0, device=CUDA))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_captured_forward_replays_the_eager_forward(backend: str) -> None:
    """anemo-infer's cuda_graphs: a replayed forward equals the eager one for new inputs of a captured shape, and a
    smaller batch gets a graph of its own."""
    from anemo_like.inference.captured_forward import CapturedForward

    model = make_model(latlon_graph(12, 24, 1), graph_attention_backend=backend).to(CUDA).eval()
    generator = torch.Generator().manual_seed(4)
    inputs = [torch.randn(b, 2, 12 * 24, 5, generator=generator).to(CUDA) for b in (2, 2, 1)]
    with torch.inference_mode():
        captured = CapturedForward(model)
        for x in inputs:
            torch.testing.assert_close(captured(x), model(x), rtol=1e-5, atol=1e-6)
    assert len(captured.graphs) == 2

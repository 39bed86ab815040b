"""The model in mixed (autocast bf16 / fp16) and reduced (bf16 weights and inputs) precision: forward and backward
run, gradients reach every parameter in its dtype, and results stay near the fp32 model."""

from __future__ import annotations

import pytest
import torch
from test_graph_attention import random_problem
from test_model import LAYOUT, make_model

from anemo_like.models import ForecastModel, mlp
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import GRAPH_ATTENTION_BACKENDS

pytestmark = pytest.mark.equivalence

MODES = ("bf16-autocast", "fp16-autocast", "bf16")
AUTOCAST = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}

OUTPUT_TOLERANCE = {"bf16-autocast": 3e-2, "fp16-autocast": 4e-3, "bf16": 3e-2}
"""Max error of the network's part of the output (the output minus the last input state the model adds to the
prognostic variables) relative to its largest fp32 magnitude. Measured over 4 seeds x both processors x both
backends: <= 9.3e-3 bf16 autocast, <= 1.1e-2 bf16 model, <= 1.0e-3 fp16 autocast."""

GRADIENT_TOLERANCE = {"bf16-autocast": 2e-2, "fp16-autocast": 4e-3, "bf16": 2e-2}
"""|g - g_fp32| / |g_fp32| over all parameter gradients together (a single parameter's gradient can be ~0 in
exact arithmetic, e.g. the key bias under the shift-invariant softmax). Measured: <= 7.2e-3 bf16, <= 1.1e-3 fp16."""

BACKEND_TOLERANCE = 2e-2
"""bf16 autocast, ``torch`` against ``reference`` graph attention, same metrics. Measured over 4 seeds: <= 8.3e-3
on the output's network part, <= 3.3e-3 on the gradients."""

ATTENTION_TOLERANCE = {torch.bfloat16: 5e-2, torch.float16: 1e-2}
"""Graph attention alone under autocast against fp32: max error relative to the largest fp32 magnitude, output and
each input gradient. Measured over 8 seeds, both backends: <= 2.1e-2 bf16, <= 2.2e-3 fp16."""

MLP_TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 4e-3}
"""The node MLP alone under autocast against fp32, same metric. Measured over 8 seeds: <= 8.8e-3 bf16, <= 8.9e-4
fp16."""


def run_model(
    graph, processor: str, backend: str, mode: str, x: torch.Tensor, processor_config: dict | None = None, **config
) -> tuple[torch.Tensor, ForecastModel]:
    """Forward and backward of a fresh seeded model in ``mode`` ("32" for fp32): the output and the model. The
    transformer processor's attention implementation follows ``backend`` (reference or SDPA)."""
    attention = "reference" if backend == "reference" else "scaled_dot_product_attention"
    processor_config = {
        "type": processor,
        "num_layers": 2,
        "window_size": 8,
        "attention_implementation": attention,
        **(processor_config or {}),
    }
    model = make_model(graph, graph_attention_backend=backend, processor=processor_config, **config)
    if mode == "bf16":
        model, x = model.to(torch.bfloat16), x.bfloat16()
    with torch.autocast("cpu", dtype=AUTOCAST.get(mode, torch.bfloat16), enabled=mode in AUTOCAST):
        y = model(x)
    y.float().square().mean().backward()
    return y, model


def network_part(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """The output minus the last input state the model adds to the prognostic variables, in fp32."""
    residual = torch.zeros_like(y, dtype=torch.float32)
    residual[..., LAYOUT.prognostic_output] = x[:, -1, :, LAYOUT.prognostic_input]
    return y.float() - residual


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().float() - want.detach().float()).abs().max() / want.detach().float().abs().max())


def all_gradients(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.float().flatten() for p in model.parameters()])


def gradient_error(model: torch.nn.Module, reference: torch.nn.Module) -> float:
    got, want = all_gradients(model), all_gradients(reference)
    return float((got - want).norm() / want.norm())


@pytest.fixture(scope="module")
def inputs(small_graph) -> torch.Tensor:
    return torch.randn(2, 2, small_graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def fp32_runs(small_graph, inputs):
    """(processor, backend) -> fp32 output and model, computed once."""
    cache = {}

    def get(processor: str, backend: str):
        if (processor, backend) not in cache:
            cache[processor, backend] = run_model(small_graph, processor, backend, "32", inputs)
        return cache[processor, backend]

    return get


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("processor", ["graphtransformer", "transformer"])
def test_forward_backward_close_to_fp32(small_graph, inputs, fp32_runs, processor, backend, mode) -> None:
    y, model = run_model(small_graph, processor, backend, mode, inputs)
    # the output has the input's dtype: under autocast the network's bf16/fp16 output is added to the fp32 state
    assert y.dtype == (torch.bfloat16 if mode == "bf16" else torch.float32)
    assert torch.isfinite(y).all()
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.dtype == p.dtype, name
        assert torch.isfinite(p.grad).all(), name
    y32, model32 = fp32_runs(processor, backend)
    assert relative_error(network_part(y, inputs), network_part(y32, inputs)) < OUTPUT_TOLERANCE[mode]
    assert gradient_error(model, model32) < GRADIENT_TOLERANCE[mode]


@pytest.mark.parametrize("processor", ["graphtransformer", "transformer"])
def test_torch_backend_equals_reference_under_bf16_autocast(small_graph, inputs, processor) -> None:
    y, model = run_model(small_graph, processor, "torch", "bf16-autocast", inputs)
    y_ref, model_ref = run_model(small_graph, processor, "reference", "bf16-autocast", inputs)
    assert relative_error(network_part(y, inputs), network_part(y_ref, inputs)) < BACKEND_TOLERANCE
    assert gradient_error(model, model_ref) < BACKEND_TOLERANCE


@pytest.mark.parametrize(
    "processor, attention", [("graphtransformer", None), ("transformer", "flash_attention")], ids=str
)
def test_chunks_checkpointing_and_eval_under_autocast(small_graph, inputs, monkeypatch, processor, attention) -> None:
    """Mapper chunks 1/2/4 with and without checkpointing, and eval mode with inference chunks (the graph
    processor's edges cut into blocks); flash_attention falls back to SDPA on CPU."""
    extra = {"attention_implementation": attention} if attention else {}
    for num_chunks, checkpointing in [(1, False), (2, True), (4, True), (4, False)]:
        mapper = {"num_chunks": num_chunks, "gradient_checkpointing": checkpointing}
        config = {"encoder": mapper, "decoder": mapper, "processor_config": {"gradient_checkpointing": checkpointing}}
        config["processor_config"].update(extra)
        y32, model32 = run_model(small_graph, processor, "torch", "32", inputs, **config)
        y, model = run_model(small_graph, processor, "torch", "bf16-autocast", inputs, **config)
        assert relative_error(network_part(y, inputs), network_part(y32, inputs)) < OUTPUT_TOLERANCE["bf16-autocast"]
        assert gradient_error(model, model32) < GRADIENT_TOLERANCE["bf16-autocast"]
    monkeypatch.setenv("ANEMOI_INFERENCE_NUM_CHUNKS", "3")
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y_eval = model(inputs)
    assert relative_error(network_part(y_eval, inputs), network_part(y32, inputs)) < OUTPUT_TOLERANCE["bf16-autocast"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_graph_attention_under_autocast_close_to_fp32(backend: str, dtype: torch.dtype) -> None:
    """Output in the autocast dtype, gradients of the fp32 inputs in fp32; backward is called inside the autocast
    region (the custom Function turns autocast off for its backward)."""
    problem, edge_index = random_problem(3, num_src=40, num_dst=30, edges=200, heads=2, channels=8)
    edges = SortedEdges(edge_index, 30)
    weights = torch.randn(2, 30, 2, 8, generator=torch.Generator().manual_seed(4))

    def run(autocast: bool):
        tensors = [t.detach().float().requires_grad_() for t in problem]
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            out = GRAPH_ATTENTION_BACKENDS[backend](*tensors, edges, min_blocks=3)
            (out.float() * weights).sum().backward()
        return out, [t.grad for t in tensors]

    out32, grads32 = run(False)
    out, grads = run(True)
    assert out.dtype == dtype and all(g.dtype == torch.float32 for g in grads)
    names = ["out", "q", "k", "v", "edge_attr", "weight", "bias"]
    for name, got, want in zip(names, [out, *grads], [out32, *grads32], strict=True):
        assert relative_error(got, want) < ATTENTION_TOLERANCE[dtype], name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_mlp_under_autocast_close_to_fp32(dtype: torch.dtype) -> None:
    """The row-blocked MLP (4 blocks) under autocast, backward inside the autocast region: output in the autocast
    dtype, input and parameter gradients in fp32 and near the fp32 ones (the weight gradients accumulate over the
    blocks in fp32)."""
    torch.manual_seed(0)
    layer, x = mlp.MLP(16, 64, block_elements=64 * 30), torch.randn(2, 60, 16)

    def run(autocast: bool):
        layer.zero_grad()
        inputs = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=dtype, enabled=autocast):
            out = layer(inputs)
            out.float().square().sum().backward()
        return out, [inputs.grad, *(p.grad for p in layer.parameters())]

    out32, grads32 = run(False)
    out, grads = run(True)
    assert out.dtype == dtype and all(g.dtype == torch.float32 for g in grads)
    for got, want in zip([out, *grads], [out32, *grads32], strict=True):
        assert relative_error(got, want) < MLP_TOLERANCE[dtype]

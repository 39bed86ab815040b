"""model.compile: configured module classes compiled in place with torch.compile (runtime/compile.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from test_model import make_model

from anemo_like.config.schema import ModelConfig
from anemo_like.models.ops.chunking import SortedEdges
from anemo_like.models.ops.graph_attention import graph_attention_torch
from anemo_like.runtime.compile import compile_modules

BLOCK = "anemo_like.models.block.GraphTransformerBlock"
BLOCK_PATHS = ["encoder.block", "processor.layers.0.block", "decoder.block"]
# torch's inductor imports torch.utils.mkldnn, which uses the deprecated torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
# one chunk per mapper and one processor layer: fewer shapes and graphs to compile
SMALL = {"encoder": {"num_chunks": 1}, "decoder": {"num_chunks": 1}, "processor": {"num_layers": 1}}


def entries(*modules: str | dict):
    """The validated ``model.compile`` list of these entries (a class path or a full entry)."""
    return ModelConfig.model_validate(
        {"compile": [{"module": m} if isinstance(m, str) else m for m in modules]}
    ).compile


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (dynamo caches on code objects, shared by all tests) and restores the
    recompile limit."""
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = limit


def failing_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
    raise RuntimeError("no kernels today")


def batch(graph, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    grid = graph["data"].num_nodes
    return torch.randn(2, 2, grid, 5, generator=g), torch.randn(2, grid, 4, generator=g)


def test_report_names_compiled_modules_and_state_dict_is_unchanged(small_graph, caplog) -> None:
    model = make_model(small_graph, **SMALL)
    keys, params = list(model.state_dict()), list(model.parameters())
    with caplog.at_level(logging.INFO, logger="anemo_like.runtime.compile"):
        report = compile_modules(model, entries(BLOCK, "torch.nn.LayerNorm"), recompile_limit=8)
    assert report.modules[BLOCK] == BLOCK_PATHS
    assert "decoder.head.0" in report.modules["torch.nn.LayerNorm"]
    assert "encoder.block.norm_src" in report.modules["torch.nn.LayerNorm"]
    assert list(model.state_dict()) == keys
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert f"compiling {BLOCK} (3 modules), torch.nn.LayerNorm (9 modules); recompile_limit 8" in caplog.text


def test_the_blocked_torch_attention_is_a_graph_break_not_traced() -> None:
    """Traced, the torch backend's block loop unrolled into one huge graph: 4 minutes to compile a block at the
    reference size and a 1.8x slower step. Dynamo must call it eagerly between two small graphs."""
    g = torch.Generator().manual_seed(0)
    dst = torch.randint(0, 20, (200,), generator=g).sort().values
    edges = SortedEdges(torch.stack([torch.randint(0, 30, (200,), generator=g), dst]), 20)
    weight, bias, edge_attr = torch.randn(8, 3), torch.randn(8), torch.randn(200, 3)

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return graph_attention_torch(q.relu(), k, v, edge_attr, weight, bias, edges) * 2

    q, k, v = torch.randn(1, 20, 2, 4), torch.randn(1, 30, 2, 4), torch.randn(1, 30, 2, 4)
    explanation = torch._dynamo.explain(attend)(q, k, v)
    assert explanation.graph_break_count == 1 and len(explanation.graphs) == 2
    assert "graph_attention_torch" in str(explanation.break_reasons[0].reason)
    assert all(len(graph.graph.nodes) < 6 for graph in explanation.graphs)  # relu before, the product after


@pytest.mark.equivalence
@pytest.mark.slow  # inductor's C++ compiles: about 20 s with a warm inductor cache, a minute or more cold
def test_compiled_model_trains_like_eager(small_graph, caplog) -> None:
    """Inductor on CPU, 3 Adam steps: losses, outputs and gradients match eager to rtol 1e-4, atol 1e-5 (inductor
    fuses and reorders fp32 reductions). The reference attention backend keeps the graph count, hence the
    compile time, down; the default backend is a graph break, run eagerly (the test above)."""
    config = {**SMALL, "graph_attention_backend": "reference"}
    eager, compiled = make_model(small_graph, **config), make_model(small_graph, **config)
    with caplog.at_level(logging.INFO, logger="anemo_like.runtime.compile"):
        report = compile_modules(compiled, entries(BLOCK, "torch.nn.LayerNorm"), recompile_limit=8)
        results = []
        for model in (eager, compiled):
            optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
            losses = []
            for step in range(3):
                x, target = batch(small_graph, step)
                loss = torch.nn.functional.mse_loss(model(x), target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.detach())
            grads = {name: p.grad for name, p in model.named_parameters()}
            results.append((torch.stack(losses), model(batch(small_graph, 3)[0]).detach(), grads))
    (losses, out, grads), (losses_c, out_c, grads_c) = results
    tolerance = {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(losses_c, losses, **tolerance)
    torch.testing.assert_close(out_c, out, **tolerance)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_c[name], grad, **tolerance, msg=name)
    assert set(report.first_call_seconds) == {BLOCK, "torch.nn.LayerNorm"} and not report.eager
    assert f"first call of {BLOCK} at encoder.block took" in caplog.text


@pytest.mark.parametrize(
    ("module", "message"),
    [
        (
            "anemo_like.models.block.GraphTransformerBlok",
            "model.compile[1].module: 'anemo_like.models.block.GraphTransformerBlok' does not import; "
            f"did you mean {BLOCK}?",
        ),
        ("anemo_like.models.nowhere.Block", "model.compile[1].module: 'anemo_like.models.nowhere.Block' does not"),
        (
            "anemo_like.models.sliding_window.SlidingWindowTransformerLayer",
            "model.compile[1].module: the model has no module of class "
            "anemo_like.models.sliding_window.SlidingWindowTransformerLayer; its classes: ",
        ),
        (
            "anemo_like.models.forecast_model.VariableLayout",
            "model.compile[1].module: 'anemo_like.models.forecast_model.VariableLayout' is not an nn.Module subclass",
        ),
        ("torch.nn.modules.normalization.LayerNorm", "torch.nn.modules.normalization.LayerNorm is already listed"),
    ],
)
def test_bad_class_fails_before_anything_compiles(small_graph, module: str, message: str) -> None:
    model = make_model(small_graph, **SMALL)
    with pytest.raises(ValueError) as error:
        compile_modules(model, entries("torch.nn.LayerNorm", module), recompile_limit=8)
    assert message in str(error.value)
    if "its classes" in message:
        assert f"{BLOCK}," in str(error.value)
    assert all(m._compiled_call_impl is None for m in model.modules())


def test_unknown_option_names_the_key_and_the_allowed_ones(small_graph) -> None:
    model = make_model(small_graph, **SMALL)
    with pytest.raises(ValueError) as error:
        compile_modules(model, entries({"module": BLOCK, "options": {"fulgraph": True}}), recompile_limit=8)
    assert "model.compile[0].options: unknown torch.compile option(s) ['fulgraph']; allowed: " in str(error.value)
    assert "fullgraph, dynamic, backend, mode" in str(error.value)


def test_compile_failure_raises_naming_the_module(small_graph) -> None:
    model = make_model(small_graph, **SMALL)
    compile_modules(model, entries({"module": BLOCK, "options": {"backend": failing_backend}}), recompile_limit=8)
    with pytest.raises(RuntimeError) as error:
        model(batch(small_graph, 0)[0])
    assert str(error.value) == (
        f"model.compile: compiling {BLOCK} at encoder.block failed: RuntimeError: no kernels today"
    )


def test_compile_failure_falls_back_to_eager(small_graph, caplog) -> None:
    eager, model = make_model(small_graph, **SMALL), make_model(small_graph, **SMALL)
    report = compile_modules(
        model,
        entries({"module": BLOCK, "options": {"backend": failing_backend}}),
        recompile_limit=8,
        on_error="eager",
    )
    x, target = batch(small_graph, 0)
    with caplog.at_level(logging.WARNING, logger="anemo_like.runtime.compile"):
        outputs = [m(x) for m in (eager, model, model)]
    for out in outputs[1:]:
        torch.testing.assert_close(out, outputs[0], rtol=0, atol=0)
    for m in (eager, model):
        torch.nn.functional.mse_loss(m(x), target).backward()
    for (name, p), q in zip(eager.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=name)
    warnings = [r.getMessage() for r in caplog.records if r.name == "anemo_like.runtime.compile"]
    assert warnings == [
        f"model.compile: compiling {BLOCK} at encoder.block failed: RuntimeError: no kernels today; "
        "running its 3 modules eagerly (model.compile_on_error=eager)"
    ]
    assert report.eager == {BLOCK: "RuntimeError: no kernels today"}


def test_torch_builtin_class_is_really_compiled(small_graph) -> None:
    """nn.Module.compile() alone hands nothing to the backend for torch.nn.LayerNorm (pytorch/pytorch#150915)."""
    graphs = []

    def recording_backend(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]):
        graphs.append(gm)
        return gm.forward

    model = make_model(small_graph, **SMALL)
    compile_modules(
        model, entries({"module": "torch.nn.LayerNorm", "options": {"backend": recording_backend}}), recompile_limit=8
    )
    model(batch(small_graph, 0)[0])
    assert graphs and all("layer_norm" in str(gm.graph) for gm in graphs)


def test_recompile_limit_is_applied(small_graph) -> None:
    compile_modules(make_model(small_graph, **SMALL), entries(BLOCK), recompile_limit=3)
    assert torch._dynamo.config.recompile_limit == 3


def test_anemo_train_compiles_the_configured_classes(tmp_path, compose_run, caplog) -> None:
    """The trainer applies ``model.compile`` from the config: the node MLP (traced as plain ops when compiled)."""
    from anemo_like.training.trainer import Trainer

    overrides = [
        "training.max_steps=2",
        "diagnostics.plots=false",
        "model.compile=[{module: anemo_like.models.mlp.MLP}]",
    ]
    with caplog.at_level(logging.INFO, logger="anemo_like.runtime.compile"):
        outputs = Trainer(compose_run(tmp_path, overrides)).fit()
    assert "model.compile: compiling anemo_like.models.mlp.MLP (" in caplog.text
    assert "first call of anemo_like.models.mlp.MLP at encoder.block.mlp took" in caplog.text
    assert outputs.metrics.exists()

"""Memory features: chunked = unchunked (fp32), bounded kernel blocks, ``num_chunks: auto``, the memory model
against measured live tensors, heap release and the live-tensor tracker."""

from __future__ import annotations

import ctypes
import itertools
import logging

import pytest
import torch
from conftest import latlon_graph
from test_model import LAYOUT, make_model

from anemo_like.config.schema import ModelConfig
from anemo_like.diagnostics.live_tensors import LiveTensorTracker
from anemo_like.models import ForecastModel, mlp
from anemo_like.models.ops import graph_attention
from anemo_like.runtime.heap_release import _glibc, free_heap_bytes, maybe_release_heap, set_heap_release
from anemo_like.runtime.memory_plan import choose_chunks, count_parameters, resolve_auto_chunks, static_bytes
from anemo_like.runtime.process_memory import current_rss_mib

COMPONENTS = ("encoder", "processor", "decoder")


def run_model(graph, chunks: dict[str, int]):
    """Outputs of encoder, processor and decoder, and every parameter gradient, of one fp32 training step."""
    model = make_model(
        graph,
        encoder={"num_chunks": chunks.get("encoder", 1)},
        decoder={"num_chunks": chunks.get("decoder", 1)},
        processor={"num_layers": 8, "num_chunks": chunks.get("processor", 1)},
    )
    outputs = {}
    for name in COMPONENTS:
        getattr(model, name).register_forward_hook(lambda _m, _i, out, name=name: outputs.__setitem__(name, out))
    x = torch.randn(2, 2, graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(1))
    model(x).square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {n: o.detach() for n, o in outputs.items()}, grads


def assert_relative_close(got: torch.Tensor, want: torch.Tensor, name: str, scale: float | None = None) -> None:
    """Equal within 1e-5 relative; ``scale`` (default: the largest value of ``want``) sets the absolute floor,
    for tensors that are zero up to rounding (e.g. the key bias gradient: the softmax ignores it)."""
    scale = float(want.abs().max()) if scale is None else scale
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale, msg=name)


def assert_same_step(got, want) -> None:
    for name, expected in want[0].items():
        assert_relative_close(got[0][name], expected, f"{name} output")
    assert got[1].keys() == want[1].keys()
    grad_scale = max(float(g.abs().max()) for g in want[1].values())
    for name, expected in want[1].items():
        assert_relative_close(got[1][name], expected, f"gradient of {name}", grad_scale)


@pytest.fixture(scope="module")
def unchunked(small_graph):
    return run_model(small_graph, {})


@pytest.mark.equivalence
@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("num_chunks", [2, 4, 8])
def test_chunked_component_equals_unchunked_fp32(small_graph, unchunked, component: str, num_chunks: int) -> None:
    assert_same_step(run_model(small_graph, {component: num_chunks}), unchunked)


@pytest.mark.equivalence
def test_small_kernel_blocks_equal_one_block(small_graph, unchunked, monkeypatch) -> None:
    """Attention over many edge blocks and the MLP over many row blocks give the one-block numbers."""
    monkeypatch.setattr(graph_attention, "BLOCK_ELEMENTS", 2 * 16 * 8)  # 8 edges per block at B=2, C=16
    monkeypatch.setattr(mlp, "ROW_BLOCK_ELEMENTS", 64 * 5)  # 5 rows per block, hidden 64
    assert_same_step(run_model(small_graph, {"encoder": 2, "decoder": 4, "processor": 3}), unchunked)


@pytest.mark.equivalence
def test_recomputed_mlp_equals_plain_mlp(monkeypatch) -> None:
    monkeypatch.setattr(mlp, "ROW_BLOCK_ELEMENTS", 12 * 7)  # 7 rows per block; 30 rows: a short last block
    torch.manual_seed(0)
    block = mlp.MLP(5, 12).double()
    plain = torch.nn.Sequential(block.fc1, torch.nn.GELU(), block.fc2)
    x = torch.randn(2, 15, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(block, (x,))
    weights = torch.randn(2, 15, 5, dtype=torch.float64)
    got = torch.autograd.grad((block(x) * weights).sum(), [x, *block.parameters()])
    want = torch.autograd.grad((plain(x) * weights).sum(), [x, *block.parameters()])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.fixture(scope="module")
def medium_graph():
    return latlon_graph(24, 48, 3)


def medium_config(**chunks) -> ModelConfig:
    sections = {name: {"num_chunks": chunks.get(name, 1)} for name in ("encoder", "decoder")}
    return ModelConfig.model_validate(
        {
            "num_channels": 64,
            "num_heads": 4,
            **sections,
            "processor": {"num_layers": 4, "num_chunks": chunks.get("processor", 1)},
        }
    )


def test_auto_picks_fewer_chunks_under_a_larger_budget(medium_graph) -> None:
    config = medium_config(encoder="auto", decoder="auto", processor="auto")
    params = count_parameters(config, medium_graph, LAYOUT, 2)
    static = static_bytes(params)

    def choose(budget: int) -> dict[str, int]:
        choices = choose_chunks(
            config=config, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=budget
        )
        return {name: choice.num_chunks for name, choice in choices.items()}

    budgets = [static + extra for extra in (1 << 18, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 30)]
    picks = [choose(b) for b in budgets]
    for smaller, larger in itertools.pairwise(picks):
        assert all(larger[name] <= smaller[name] for name in smaller), picks
    assert picks[-1] == {"encoder": 1, "processor": 1, "decoder": 1}
    assert picks[0]["decoder"] >= 8 and picks[0]["processor"] == 4
    tight = choose_chunks(config=config, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=static)
    assert not any(choice.fits for choice in tight.values()), "nothing fits a budget without room for activations"


def test_resolved_auto_chunks_are_logged_and_required(medium_graph, caplog) -> None:
    config = medium_config(encoder="auto", processor=2)
    with pytest.raises(ValueError, match=r"num_chunks of \['encoder'\] is 'auto'"):
        ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2)
    params = count_parameters(config, medium_graph, LAYOUT, 2)
    with caplog.at_level(logging.INFO, logger="anemo_like.runtime.memory_plan"):
        resolved = resolve_auto_chunks(
            config, graph=medium_graph, batch_size=2, num_parameters=params, budget_bytes=16 << 30
        )
    assert resolved.encoder.num_chunks == 1 and resolved.processor.num_chunks == 2
    assert "encoder num_chunks auto -> 1: predicted peak step memory" in caplog.text
    ForecastModel(config=resolved, graph=medium_graph, layout=LAYOUT, multistep=2)


@pytest.mark.parametrize("num_chunks", [1, 4])
def test_predicted_activation_memory_bounds_the_measured_peak(medium_graph, num_chunks: int) -> None:
    """The memory model's per-component activation peak is within [1, 1.6] of live tensors measured in a step."""
    torch.manual_seed(0)
    config = medium_config(encoder=num_chunks, decoder=num_chunks, processor=min(num_chunks, 4))
    model = ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2).train()
    batch = 2
    x_data = torch.randn(batch, medium_graph["data"].num_nodes, 2 * 5 + model.data_features.num_features)
    x_hidden = model.hidden_features(batch)
    latent = torch.randn(batch, medium_graph["hidden"].num_nodes, 64, requires_grad=True)
    runs = {
        "encoder": lambda: model.encoder(x_data, x_hidden),
        "processor": lambda: model.processor(latent),
        "decoder": lambda: model.decoder(latent, x_data),
    }
    params = sum(p.numel() for p in model.parameters())
    predicted = choose_chunks(
        config=config, graph=medium_graph, batch_size=batch, num_parameters=params, budget_bytes=0
    )
    for name, run in runs.items():
        for _ in range(2):  # the first step also builds plans and scratch buffers
            with LiveTensorTracker() as tracker:
                run().square().sum().backward()
            model.zero_grad(set_to_none=True)
        component_grads = sum(p.numel() * 4 for p in getattr(model, name).parameters())
        measured = tracker.peak_bytes - component_grads
        activation = predicted[name].predicted_bytes - static_bytes(params)
        assert measured <= activation <= 1.6 * measured, (name, measured, activation)


def test_live_tensor_tracker_counts_storages_not_views() -> None:
    with LiveTensorTracker() as tracker:
        a = torch.empty(1 << 20)  # 4 MiB
        view = a.view(1024, 1024).t()
        b = view + 1  # 4 MiB
        a.add_(1)
        c = b * 2  # 4 MiB while a and b are alive: 12 MiB peak
        del a, view, b, c
    assert tracker.peak_bytes == 3 * 4 << 20
    assert tracker.live_bytes == 0


@pytest.mark.skipif(_glibc() is None, reason="needs glibc")
def test_heap_release_returns_free_heap_pages_to_the_system() -> None:
    libc = _glibc()
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(60 << 10) for _ in range(2000)]  # 117 MiB of small heap blocks (below mmap threshold)
    for block in blocks:
        ctypes.memset(block, 1, 60 << 10)
    for block in blocks[:-1]:  # the last block pins the top of the heap: only an interior release helps
        libc.free(block)
    try:
        assert free_heap_bytes() > 100 << 20
        before = current_rss_mib()
        assert set_heap_release(None) is False
        maybe_release_heap()
        assert current_rss_mib() > before - 10, "switched off: nothing released"
        assert set_heap_release(64) is True
        maybe_release_heap()
        assert current_rss_mib() < before - 80
    finally:
        set_heap_release(None)
        libc.free(blocks[-1])

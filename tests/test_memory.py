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
from anemo_like.models.ops import workspace
from anemo_like.runtime.heap_release import _glibc, free_heap_bytes, maybe_release_heap, set_heap_release
from anemo_like.runtime.memory_model import SCRATCH_BLOCKS, activation_peak_bytes, component_models, static_bytes
from anemo_like.runtime.memory_plan import (
    apply_validation_chunks,
    choose_plan,
    choose_validation_chunks,
    count_parameters,
    resolve_auto_settings,
)
from anemo_like.runtime.process_memory import current_rss_mib

COMPONENTS = ("encoder", "processor", "decoder")
CPU = torch.device("cpu")


def run_model(graph, chunks: dict[str, int | bool], **overrides):
    """Outputs of encoder, processor and decoder, and every parameter gradient, of one fp32 training step
    (``chunks["checkpointing"]``: recomputation, default on; ``overrides``: other model config keys)."""
    recompute = chunks.get("checkpointing", True)
    model = make_model(
        graph,
        **overrides,
        encoder={"num_chunks": chunks.get("encoder", 1), "gradient_checkpointing": recompute},
        decoder={"num_chunks": chunks.get("decoder", 1), "gradient_checkpointing": recompute},
        processor={"num_layers": 8, "num_chunks": chunks.get("processor", 1), "gradient_checkpointing": recompute},
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
def test_small_kernel_blocks_equal_one_block(small_graph, unchunked) -> None:
    """Attention over many edge blocks and the MLP over many row blocks give the one-block numbers."""
    chunks = {"encoder": 2, "decoder": 4, "processor": 3}
    # 8 edges per block at B=2, C=16; 4 rows per block, hidden 64
    assert_same_step(run_model(small_graph, chunks, block_elements=2 * 16 * 8), unchunked)


def test_block_elements_default_per_device_and_its_memory_is_planned(medium_graph) -> None:
    """auto: cache-sized blocks on CPU, large ones on a GPU; the plan counts the scratch of the device's blocks."""
    assert workspace.resolve_block_elements(None, torch.device("cpu")) == workspace.CPU_BLOCK_ELEMENTS
    assert workspace.resolve_block_elements(None, torch.device("cuda")) == workspace.GPU_BLOCK_ELEMENTS
    assert workspace.resolve_block_elements(1 << 10, torch.device("cuda")) == 1 << 10
    config = medium_config(encoder=2, decoder=2, processor=2)
    params = count_parameters(config, medium_graph, LAYOUT, 2)

    def peak(device: str, **overrides) -> int:
        model_config = config.model_copy(update=overrides)
        args = {"graph": medium_graph, "batch_size": 4, "num_parameters": params, "budget_bytes": 1 << 40}
        return choose_plan(config=model_config, device=torch.device(device), **args).peak_bytes

    blocks = workspace.GPU_BLOCK_ELEMENTS - workspace.CPU_BLOCK_ELEMENTS
    assert peak("cuda") - peak("cpu") == 4 * SCRATCH_BLOCKS * blocks
    assert peak("cuda", block_elements=workspace.CPU_BLOCK_ELEMENTS) == peak("cpu")


@pytest.mark.equivalence
def test_recomputed_mlp_equals_plain_mlp() -> None:
    torch.manual_seed(0)
    block = mlp.MLP(5, 12, block_elements=12 * 7).double()  # 7 rows per block; 30 rows: a short last block
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


def medium_config(checkpointing: bool | str = True, **chunks) -> ModelConfig:
    sections = {
        name: {"num_chunks": chunks.get(name, 1), "gradient_checkpointing": checkpointing}
        for name in ("encoder", "decoder")
    }
    return ModelConfig.model_validate(
        {
            "num_channels": 64,
            "num_heads": 4,
            **sections,
            "processor": {
                "num_layers": 4,
                "num_chunks": chunks.get("processor", 1),
                "gradient_checkpointing": checkpointing,
            },
        }
    )


def plan_settings(plan) -> dict[str, tuple[bool, int]]:
    return {name: (cost.checkpointing, cost.num_chunks) for name, cost in plan.components.items()}


def test_auto_picks_fewer_chunks_under_a_larger_budget(medium_graph) -> None:
    config = medium_config(encoder="auto", decoder="auto", processor="auto")
    params = count_parameters(config, medium_graph, LAYOUT, 2)
    static = static_bytes(params, workspace.CPU_BLOCK_ELEMENTS)

    def choose(budget: int) -> dict[str, int]:
        plan = choose_plan(
            config=config, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=budget, device=CPU
        )
        return {name: cost.num_chunks for name, cost in plan.components.items()}

    budgets = [static + extra for extra in (1 << 18, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 1 << 30)]
    picks = [choose(b) for b in budgets]
    for smaller, larger in itertools.pairwise(picks):
        assert all(larger[name] <= smaller[name] for name in smaller), picks
    assert picks[-1] == {"encoder": 1, "processor": 1, "decoder": 1}
    assert picks[0]["decoder"] >= 4 and picks[0]["processor"] == 4
    tight = choose_plan(
        config=config, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=static, device=CPU
    )
    assert not tight.fits, "nothing fits a budget without room for activations"


def test_plan_drops_recomputation_when_the_budget_allows(medium_graph) -> None:
    """A huge budget: no recomputation, one chunk; a tiny one: recompute everything, the most chunks (flagged);
    in between the plan's predicted peak fits and it recomputes no more than a larger budget's plan."""
    config = medium_config("auto", encoder="auto", decoder="auto", processor="auto")
    params = count_parameters(config, medium_graph, LAYOUT, 2)

    def choose(budget: int):
        return choose_plan(
            config=config, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=budget, device=CPU
        )

    huge = choose(1 << 40)
    assert huge.fits and plan_settings(huge) == {name: (False, 1) for name in COMPONENTS}
    tiny = choose(1)
    assert not tiny.fits
    assert all(checkpointing for checkpointing, _ in plan_settings(tiny).values())
    assert plan_settings(tiny)["processor"] == (True, 4) and plan_settings(tiny)["decoder"][1] >= 4
    static = static_bytes(params, workspace.CPU_BLOCK_ELEMENTS)
    plans = [choose(static + extra) for extra in (2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20)]
    for smaller, larger in itertools.pairwise(plans):
        assert larger.work <= smaller.work
    for budget, plan in zip((2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20), plans, strict=True):
        assert not plan.fits or plan.peak_bytes <= static + budget
    recomputed = [sum(c.checkpointing for c in plan.components.values()) for plan in plans]
    assert recomputed[0] > recomputed[-1] == 0, recomputed
    fixed = medium_config(True, encoder="auto", decoder="auto", processor="auto")
    kept = choose_plan(
        config=fixed, graph=medium_graph, batch_size=4, num_parameters=params, budget_bytes=1 << 40, device=CPU
    )
    assert plan_settings(kept) == {name: (True, 1) for name in COMPONENTS}, "a fixed setting is kept"


def test_resolved_auto_settings_are_logged_and_required(medium_graph, caplog) -> None:
    config = medium_config("auto", encoder="auto", processor=2)
    with pytest.raises(ValueError, match=r"\['encoder.num_chunks', 'encoder.gradient_checkpointing'"):
        ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2)
    params = count_parameters(config, medium_graph, LAYOUT, 2)
    with caplog.at_level(logging.INFO, logger="anemo_like.runtime.memory_plan"):
        resolved, plan = resolve_auto_settings(
            config, graph=medium_graph, batch_size=2, num_parameters=params, budget_bytes=16 << 30, device=CPU
        )
    assert resolved.encoder.num_chunks == 1 and resolved.processor.num_chunks == 2
    assert not resolved.encoder.gradient_checkpointing and not resolved.processor.gradient_checkpointing
    assert plan.fits and "memory plan: encoder chunks 1 recompute off" in caplog.text
    assert "predicted peak step memory" in caplog.text
    ForecastModel(config=resolved, graph=medium_graph, layout=LAYOUT, multistep=2)


@pytest.mark.equivalence
def test_chosen_plan_computes_the_default_plans_numbers_fp32(small_graph, unchunked) -> None:
    """The plan a huge budget picks (no recomputation) and a tiny one (recomputation, many chunks) give the
    numbers of the unchunked recomputing model."""
    config = ModelConfig.model_validate(
        {
            "num_channels": 16,
            "num_heads": 4,
            **{n: {"num_chunks": "auto", "gradient_checkpointing": "auto"} for n in COMPONENTS},
        }
        | {"processor": {"num_layers": 8, "num_chunks": "auto", "gradient_checkpointing": "auto"}}
    )
    params = count_parameters(config, small_graph, LAYOUT, 2)
    for budget in (1 << 40, 1):
        resolved, _ = resolve_auto_settings(
            config, graph=small_graph, batch_size=2, num_parameters=params, budget_bytes=budget, device=CPU
        )
        chunks = {name: getattr(resolved, name).num_chunks for name in COMPONENTS}
        recompute = resolved.encoder.gradient_checkpointing
        assert all(getattr(resolved, name).gradient_checkpointing == recompute for name in COMPONENTS)
        assert_same_step(run_model(small_graph, {**chunks, "checkpointing": recompute}), unchunked)


def measured_activation_peak(model: ForecastModel, run, name: str) -> int:
    """Live-tensor peak of ``run``'s forward + backward, less the component's gradients (second run: the first
    also builds plans and scratch buffers)."""
    for _ in range(2):
        with LiveTensorTracker() as tracker:
            run().square().sum().backward()
        model.zero_grad(set_to_none=True)
    module = model if name == "step" else getattr(model, name)
    return tracker.peak_bytes - sum(p.numel() * 4 for p in module.parameters())


@pytest.mark.parametrize("checkpointing", [True, False])
@pytest.mark.parametrize("num_chunks", [1, 4])
def test_predicted_activation_memory_bounds_the_measured_peak(medium_graph, num_chunks: int, checkpointing) -> None:
    """The memory model's activation peaks (each component, and the whole forward + backward) are within
    [1, 1.6] of the live tensors measured."""
    torch.manual_seed(0)
    config = medium_config(checkpointing, encoder=num_chunks, decoder=num_chunks, processor=min(num_chunks, 4))
    model = ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2).train()
    batch = 2
    x_data = torch.randn(batch, medium_graph["data"].num_nodes, 2 * 5 + model.data_features.num_features)
    x_hidden = model.hidden_features(batch)
    latent = torch.randn(batch, medium_graph["hidden"].num_nodes, 64, requires_grad=True)
    x = torch.randn(batch, 2, medium_graph["data"].num_nodes, 5)
    runs = {
        "encoder": lambda: model.encoder(x_data, x_hidden),
        "processor": lambda: model.processor(latent),
        "decoder": lambda: model.decoder(latent, x_data),
        "step": lambda: model(x),
    }
    models = component_models(config, medium_graph, batch)
    costs = {name: models[name].cost(checkpointing, getattr(config, name).num_chunks) for name in COMPONENTS}
    predicted = {name: cost.peak_bytes for name, cost in costs.items()} | {"step": activation_peak_bytes(costs)}
    for name, run in runs.items():
        measured = measured_activation_peak(model, run, name)
        assert measured <= predicted[name] <= 1.6 * measured, (name, measured, predicted[name])


@pytest.mark.parametrize("num_chunks", [1, 4])
def test_predicted_validation_memory_bounds_the_measured_peak(medium_graph, num_chunks: int) -> None:
    """Forwards without gradients (validation): each component's predicted peak is within [1, 1.6] of the live
    tensors measured."""
    torch.manual_seed(0)
    config = medium_config(encoder=num_chunks, decoder=num_chunks)
    model = ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2).eval()
    batch = 2
    x_data = torch.randn(batch, medium_graph["data"].num_nodes, 2 * 5 + model.data_features.num_features)
    latent = torch.randn(batch, medium_graph["hidden"].num_nodes, 64)
    runs = {
        "encoder": lambda: model.encoder(x_data, model.hidden_features(batch)),
        "processor": lambda: model.processor(latent),
        "decoder": lambda: model.decoder(latent, x_data),
    }
    models = component_models(config, medium_graph, batch)
    for name, run in runs.items():
        with torch.no_grad():
            for _ in range(2):
                with LiveTensorTracker() as tracker:
                    out = run()
                    del out
        predicted = models[name].eval_bytes() if name == "processor" else models[name].eval_bytes(num_chunks)
        assert tracker.peak_bytes <= predicted <= 1.6 * tracker.peak_bytes, (name, tracker.peak_bytes, predicted)


def test_validation_gets_more_chunks_only_when_its_batch_needs_them(medium_graph, monkeypatch) -> None:
    config = medium_config(False, encoder=1, decoder=1)
    params = count_parameters(config, medium_graph, LAYOUT, 2)

    def choose(budget: int) -> dict[str, tuple[int, int]]:
        return choose_validation_chunks(
            config=config, graph=medium_graph, batch_size=8, num_parameters=params, budget_bytes=budget, device=CPU
        )

    spare = choose(1 << 30)
    assert {name: count for name, (count, _) in spare.items()} == {"encoder": 1, "decoder": 1}, "validation as training"
    budget = static_bytes(params, workspace.CPU_BLOCK_ELEMENTS) + (20 << 20)
    tight = {name: count for name, (count, _) in choose(budget).items()}
    assert tight["decoder"] > 1 and all(peak <= budget for _, peak in choose(budget).values()), choose(budget)
    model = ForecastModel(config=config, graph=medium_graph, layout=LAYOUT, multistep=2)
    model.encoder.eval_num_chunks = 2  # as ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER sets it: the environment wins
    apply_validation_chunks(model, {"encoder": (8, 0), "decoder": (tight["decoder"], 0)}, 8)
    assert model.encoder.eval_num_chunks == 2 and model.decoder.eval_num_chunks == tight["decoder"]


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

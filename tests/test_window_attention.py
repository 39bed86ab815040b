"""Transformer-processor attention backends: each equals the reference; flash-attn's wrapper is checked against a
CPU stand-in with flash-attn's call contract; fallback and the run-time override."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import Tensor

from anemo_like.inference import load_inference_checkpoint
from anemo_like.models.ops import window_attention
from anemo_like.models.ops.window_attention import (
    band_attention,
    flash_attention,
    flash_unavailable_reason,
    reference_attention,
)
from anemo_like.models.ops.window_attention import (
    window_attention as attend,
)
from anemo_like.models.sliding_window import SlidingWindowTransformerLayer
from anemo_like.runtime.inference_environment import (
    GRAPH_BACKEND_VARIABLE,
    apply_inference_overrides,
)
from anemo_like.runtime.inference_environment import TRANSFORMER_BACKEND_VARIABLE as ENV_VARIABLE
from anemo_like.training.trainer import Trainer

pytestmark = pytest.mark.equivalence


def flash_attn_stand_in(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
) -> Tensor:
    """flash-attn 2's ``flash_attn_func`` contract on CPU: (B, N, H, C) in and out; query i sees keys
    i - window_size[0] .. i + window_size[1] (-1: unbounded); scale defaults to C ** -0.5."""
    assert q.dim() == 4 and q.shape == k.shape == v.shape and dropout_p == 0.0 and not causal
    n, c = q.shape[1], q.shape[-1]
    scale = c**-0.5 if softmax_scale is None else softmax_scale
    left, right = (n if w < 0 else w for w in window_size)
    i = torch.arange(n)
    offset = i[None, :] - i[:, None]  # key - query
    allowed = (offset >= -left) & (offset <= right)
    scores = torch.einsum("bqhc,bkhc->bhqk", q, k) * scale
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("bhqk,bkhc->bqhc", weights, v)


@pytest.fixture
def qkv() -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(1)
    # B=2, H=3, N=77 (not a multiple of the query block), C=12; H != N so a layout mix-up cannot pass
    return tuple(torch.randn(2, 3, 77, 12, generator=g, dtype=torch.float64) for _ in range(3))


@pytest.mark.parametrize("window", [0, 3, 20, 40, 76, 200])
def test_every_backend_equals_the_reference(qkv, window: int) -> None:
    q, k, v = qkv
    expected = reference_attention(q, k, v, window=window)
    torch.testing.assert_close(band_attention(q, k, v, window=window), expected)
    torch.testing.assert_close(flash_attention(q, k, v, window=window, flash=flash_attn_stand_in), expected)


def test_flash_attention_3_returning_the_lse_too(qkv) -> None:
    q, k, v = qkv

    def flash3(*args: Tensor, **kwargs: object) -> tuple[Tensor, Tensor]:
        out = flash_attn_stand_in(*args, **kwargs)
        return out, torch.zeros(out.shape[:-1])

    torch.testing.assert_close(flash_attention(q, k, v, window=5, flash=flash3), reference_attention(q, k, v, window=5))


def test_flash_runs_only_where_it_can() -> None:
    cuda = torch.device("cuda")
    assert flash_unavailable_reason(cuda, torch.bfloat16, flash_attn_stand_in) is None
    assert "not installed" in flash_unavailable_reason(cuda, torch.bfloat16, None)
    assert "needs a CUDA device, the inputs are on cpu" in flash_unavailable_reason(
        torch.device("cpu"), torch.bfloat16, flash_attn_stand_in
    )
    assert "needs fp16 or bf16 inputs" in flash_unavailable_reason(cuda, torch.float32, flash_attn_stand_in)


def test_flash_on_cpu_falls_back_to_sdpa_with_one_log_line(qkv, caplog, monkeypatch) -> None:
    monkeypatch.setattr(window_attention, "_reported", set())
    q, k, v = qkv
    with caplog.at_level(logging.WARNING, logger=window_attention.__name__):
        for _ in range(3):
            out = attend(q, k, v, window=7, backend="flash_attention", flash=flash_attn_stand_in)
    torch.testing.assert_close(out, band_attention(q, k, v, window=7))
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "attention backend flash_attention cannot run here: flash-attn needs a CUDA device, the inputs are on cpu; "
        "using scaled_dot_product_attention"
    ]


def test_environment_overrides_the_backend_in_eval_mode_only(monkeypatch) -> None:
    layer = SlidingWindowTransformerLayer(
        channels=12, num_heads=3, mlp_hidden_ratio=2.0, window_size=5, attention_implementation="flash_attention"
    ).double()
    x = torch.randn(2, 40, 12, dtype=torch.float64)
    used = []
    monkeypatch.setattr(
        "anemo_like.models.sliding_window.window_attention",
        lambda q, k, v, *, window, backend: used.append(backend) or reference_attention(q, k, v, window=window),
    )
    monkeypatch.setenv(ENV_VARIABLE, "reference")
    apply_inference_overrides(layer)
    layer.train()(x)
    layer.eval()(x)
    assert used == ["flash_attention", "reference"]
    monkeypatch.setenv(ENV_VARIABLE, "flash")
    with pytest.raises(
        ValueError, match=f"environment variable {ENV_VARIABLE}='flash': expected one of flash_attention"
    ):
        apply_inference_overrides(layer)


def test_a_model_trained_naming_flash_attention_runs_on_cpu_with_the_fallback_line(
    tmp_path, compose_run, caplog, monkeypatch
) -> None:
    monkeypatch.setattr(window_attention, "_reported", set())
    config = compose_run(
        tmp_path,
        [
            "model=transformer",
            "model.processor.window_size=16",
            "model.processor.attention_implementation=flash_attention",
            "training.max_steps=2",
            "diagnostics.plots=false",
        ],
    )
    with caplog.at_level(logging.WARNING, logger=window_attention.__name__):
        outputs = Trainer(config).fit()
        bundle = load_inference_checkpoint(outputs.inference_checkpoint)
        assert bundle.config.model.processor.attention_implementation == "flash_attention"
        x = torch.randn(1, 2, 2048, bundle.model.layout.num_input)
        with torch.no_grad():
            flash_named = bundle.model(x)
            monkeypatch.setenv(ENV_VARIABLE, "reference")
            reference = apply_inference_overrides(bundle.model)(x)
    torch.testing.assert_close(flash_named, reference, rtol=1e-4, atol=1e-5)
    assert any("flash_attention cannot run here" in r.getMessage() for r in caplog.records)


def test_graph_attention_backend_from_the_environment_at_load(tmp_path, compose_run, monkeypatch) -> None:
    outputs = Trainer(compose_run(tmp_path, ["training.max_steps=1", "diagnostics.plots=false"])).fit()
    x = torch.randn(1, 2, 2048, load_inference_checkpoint(outputs.inference_checkpoint).model.layout.num_input)
    with torch.no_grad():
        trained = load_inference_checkpoint(outputs.inference_checkpoint)
        monkeypatch.setenv(GRAPH_BACKEND_VARIABLE, "reference")
        overridden = load_inference_checkpoint(outputs.inference_checkpoint)
        assert (trained.config.model.graph_attention_backend, overridden.config.model.graph_attention_backend) == (
            "torch",
            "reference",
        )
        torch.testing.assert_close(overridden.model(x), trained.model(x), rtol=1e-4, atol=1e-5)
    monkeypatch.setenv(GRAPH_BACKEND_VARIABLE, "pyg")
    with pytest.raises(ValueError, match=f"{GRAPH_BACKEND_VARIABLE}='pyg': expected one of torch, reference, triton"):
        load_inference_checkpoint(outputs.inference_checkpoint)

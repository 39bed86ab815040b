"""Model shapes and numerical equivalences: chunked = unchunked, checkpointed = plain, banded = dense attention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from anemo_like.config.schema import ModelConfig
from anemo_like.graphs import build_graph
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.ops.window_attention import band_attention

LAYOUT = VariableLayout(
    num_input=5, num_output=4, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={3: -0.5}
)


def make_model(graph, *, seed: int = 0, **overrides) -> ForecastModel:
    torch.manual_seed(seed)
    config = ModelConfig.model_validate(
        {"num_channels": 16, "num_heads": 4, "processor": {"num_layers": 2}, **overrides}
    )
    model = ForecastModel(config=config, graph=graph, layout=LAYOUT, multistep=2)
    with torch.no_grad():  # trainable node/edge features start at zero: make them matter for the tests
        for name, p in model.named_parameters():
            if "trainable" in name:
                p.normal_()
    return model


def test_output_shape_residual_and_bounding(small_graph) -> None:
    model = make_model(small_graph)
    x = torch.randn(3, 2, small_graph["data"].num_nodes, 5)
    y = model(x)
    assert y.shape == (3, small_graph["data"].num_nodes, 4)
    assert torch.all(y[..., 3] >= -0.5)
    # the prognostic residual: shifting the last input state of a prognostic variable shifts the output.
    x_shift = x.clone()
    x_shift[:, -1, :, 1] += 100.0
    assert (model(x_shift)[..., 1] - y[..., 1]).mean() > 50.0


@pytest.mark.equivalence
@pytest.mark.parametrize("processor", ["graphtransformer", "transformer"])
def test_chunked_equals_unchunked_forward_and_gradients(small_graph, processor: str) -> None:
    def run(num_chunks: int, checkpointing: bool):
        model = make_model(
            small_graph,
            encoder={"num_chunks": num_chunks, "gradient_checkpointing": checkpointing},
            decoder={"num_chunks": num_chunks, "gradient_checkpointing": checkpointing},
            processor={
                "type": processor,
                "num_layers": 2,
                "num_chunks": min(num_chunks, 2),
                "gradient_checkpointing": checkpointing,
                "window_size": 8,
            },
        ).double()
        x = torch.randn(2, 2, small_graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(1))
        y = model(x.double())
        y.square().sum().backward()
        return y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    y_ref, g_ref = run(1, False)
    for num_chunks, checkpointing in [(4, True), (8, False), (2, True)]:
        y, g = run(num_chunks, checkpointing)
        torch.testing.assert_close(y, y_ref)
        assert g.keys() == g_ref.keys()
        for name in g_ref:
            torch.testing.assert_close(g[name], g_ref[name], msg=name)


@pytest.mark.equivalence
def test_sliding_window_equals_dense_mask() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 301, 8, generator=g, dtype=torch.float64) for _ in range(3))
    for window in (5, 40, 100, 150, 200, 299, 300, 400):
        i = torch.arange(301)
        mask = (i[:, None] - i[None, :]).abs() <= window
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(band_attention(q, k, v, window=window), expected)


def test_transformer_processor_needs_no_processor_edges() -> None:
    lats = -90.0 + (np.arange(6) + 0.5) * 30.0
    lons = np.arange(12) * 30.0
    lat, lon = (a.ravel() for a in np.meshgrid(lats, lons, indexing="ij"))
    graph = build_graph(lat, lon, mesh_resolution=1, processor_edges=False)
    model = make_model(graph, processor={"type": "transformer", "num_layers": 1, "window_size": 4})
    assert model(torch.randn(1, 2, 72, 5)).shape == (1, 72, 4)
    with pytest.raises(ValueError, match="hidden->hidden edges"):
        make_model(graph)


def test_components_take_their_own_config_section(small_graph) -> None:
    model = make_model(
        small_graph,
        encoder={"num_chunks": 2, "gradient_checkpointing": False},
        decoder={"num_chunks": 8, "shard_strategy": "heads"},
        processor={"num_layers": 3, "num_chunks": 3, "gradient_checkpointing": False},
    )
    encoder, processor, decoder = model.encoder, model.processor, model.decoder
    assert (encoder.num_chunks, encoder.gradient_checkpointing, encoder.shard_strategy) == (2, False, "edges")
    assert (decoder.num_chunks, decoder.gradient_checkpointing, decoder.shard_strategy) == (8, True, "heads")
    assert (processor.num_chunks, processor.gradient_checkpointing, len(processor.layers)) == (3, False, 3)
    num_data, num_hidden = small_graph["data"].num_nodes, small_graph["hidden"].num_nodes
    assert (encoder.num_src, encoder.num_dst, encoder.sources_sharded) == (num_data, num_hidden, False)
    assert (decoder.num_src, decoder.num_dst, decoder.sources_sharded) == (num_hidden, num_data, True)
    assert (encoder.out_channels, decoder.out_channels) == (16, LAYOUT.num_output)


def test_a_model_trains_after_a_forecast_in_the_same_process(small_graph) -> None:
    """Scratch buffers made under torch.inference_mode (anemo-infer) are not the ones training writes to."""
    x = torch.randn(2, 2, small_graph["data"].num_nodes, 5)
    with torch.inference_mode():
        make_model(small_graph)(x)
    model = make_model(small_graph)
    model(x).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)

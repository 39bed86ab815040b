"""ANEMOI_INFERENCE_NUM_CHUNKS[_MAPPER|_PROCESSOR]: read at setup (apply_inference_overrides), change chunking in
eval mode only, and never change the numbers."""

from __future__ import annotations

import pytest
import torch
from test_model import make_model

from anemo_like.runtime.inference_environment import apply_inference_overrides

pytestmark = pytest.mark.equivalence

VARIABLES = (
    "ANEMOI_INFERENCE_NUM_CHUNKS",
    "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER",
    "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR",
)


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def model_and_input(graph):
    model = make_model(graph, encoder={"num_chunks": 1}, decoder={"num_chunks": 1}).eval()
    x = torch.randn(2, 2, graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(3))
    return model, x


@pytest.mark.parametrize(
    ("settings", "mapper", "processor"),
    [
        ({"ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER": "4"}, 4, None),
        ({"ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR": "3"}, 1, 3),
        ({"ANEMOI_INFERENCE_NUM_CHUNKS": "8"}, 8, 8),
        ({"ANEMOI_INFERENCE_NUM_CHUNKS": "2", "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER": "16"}, 16, 2),
    ],
)
def test_env_chunking_in_eval_equals_unchunked(small_graph, clean_env, settings, mapper, processor) -> None:
    model, x = model_and_input(small_graph)
    with torch.no_grad():
        expected = model(x)
        for name, value in settings.items():
            clean_env.setenv(name, value)
        got = apply_inference_overrides(model)(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert mapper in model.encoder.edges.planned_chunk_counts() and mapper in model.decoder.edges.planned_chunk_counts()
    assert model.processor.edges.planned_chunk_counts() == ([] if processor is None else [processor])


def test_env_is_ignored_in_training_and_applied_in_eval(small_graph, clean_env) -> None:
    model, x = model_and_input(small_graph)
    clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS", "4")
    apply_inference_overrides(model)
    model.train()
    model(x).sum().backward()
    processor = model.processor.edges
    assert model.encoder.edges.planned_chunk_counts() == [1] and processor.planned_chunk_counts() == []
    model.eval()
    with torch.no_grad():
        model(x)
        clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS", "2")
        apply_inference_overrides(model)(x)
    assert model.encoder.edges.planned_chunk_counts() == [1, 2, 4]
    assert processor.planned_chunk_counts() == [2, 4]  # destination chunks of each layer, in eval only


@pytest.mark.parametrize("value", ["0", "-2", "four", "1.5"])
def test_invalid_value_names_the_variable(small_graph, clean_env, value: str) -> None:
    model, _ = model_and_input(small_graph)
    clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR", value)
    expected = f"ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR={value!r}: expected a positive"
    with pytest.raises(ValueError, match=expected):
        apply_inference_overrides(model)


def test_processor_chunks_of_a_noise_conditioned_model_equal_unchunked(small_graph, clean_env) -> None:
    """An ensemble model's processor norms read each node's noise: a chunk reads its own rows of it."""
    model = make_model(small_graph, noise={"channels": 4}, encoder={"num_chunks": 1}, decoder={"num_chunks": 1}).eval()
    x = torch.randn(2, 2, small_graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(3))
    noise = torch.randn(model.noise_shape(2), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(x, noise)
        clean_env.setenv("ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR", "5")
        got = apply_inference_overrides(model)(x, noise)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert model.processor.edges.planned_chunk_counts() == [5]

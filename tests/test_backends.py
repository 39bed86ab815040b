"""Backend selection: a configured backend that cannot run here falls back with one log line and the same
numbers; ``model.strict_backends`` turns that into a setup error naming the key and the reason."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch
from conftest import TINY_MODEL

from anemo_like.config.schema import ModelConfig
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.ops.triton_graph_attention import triton_unavailable_reason
from anemo_like.runtime.backends import check_backends, unavailable_backends

LAYOUT = VariableLayout(
    num_input=3, num_output=3, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={}
)
NO_TRITON_HERE = triton_unavailable_reason(torch.device("cpu"))


def model_with(graph, **overrides) -> ForecastModel:
    torch.manual_seed(0)
    config = ModelConfig.model_validate(
        {"num_channels": 16, "num_heads": 4, "processor": {"num_layers": 2}, **overrides}
    )
    return ForecastModel(config=config, graph=graph, layout=LAYOUT, multistep=2)


@pytest.mark.skipif(NO_TRITON_HERE is None, reason="Triton kernels can run here: there is nothing to fall back from")
def test_triton_falls_back_to_torch_with_one_log_line(small_graph, caplog) -> None:
    x = torch.randn(1, 2, small_graph["data"].num_nodes, 3, generator=torch.Generator().manual_seed(1))
    with caplog.at_level(logging.WARNING, logger="anemo_like.models.ops.graph_attention"):
        fallback = model_with(small_graph, graph_attention_backend="triton")(x)
        model_with(small_graph, graph_attention_backend="triton")(x)
    torch.testing.assert_close(fallback, model_with(small_graph, graph_attention_backend="torch")(x))
    lines = [r.getMessage() for r in caplog.records if "cannot run here" in r.getMessage()]
    assert lines == [f"graph attention backend triton cannot run here: {NO_TRITON_HERE}; using torch"]


@pytest.mark.skipif(NO_TRITON_HERE is None, reason="Triton kernels can run here")
def test_strict_backends_is_a_setup_error_naming_key_and_reason() -> None:
    config = ModelConfig(graph_attention_backend="triton", strict_backends=True)
    with pytest.raises(ValueError) as error:
        check_backends(config, torch.device("cpu"))
    assert str(error.value) == (
        f"model.strict_backends is true and model.graph_attention_backend=triton: {NO_TRITON_HERE} "
        "(set model.strict_backends=false to fall back with a log line)"
    )
    check_backends(config.model_copy(update={"strict_backends": False}), torch.device("cpu"))  # falls back


def test_flash_attention_is_checked_for_device_and_dtype() -> None:
    config = ModelConfig.model_validate(
        {"processor": {"type": "transformer", "attention_implementation": "flash_attention"}, "strict_backends": True}
    )
    [problem] = unavailable_backends(config, torch.device("cpu"), torch.bfloat16)
    assert problem.startswith("model.processor.attention_implementation=flash_attention: flash-attn ")
    with pytest.raises(ValueError, match=r"strict_backends is true and model\.processor\.attention_implementation"):
        check_backends(config, torch.device("cpu"), torch.bfloat16)
    assert unavailable_backends(ModelConfig(), torch.device("cpu"), torch.float32) == []


def test_cli_strict_backend_error(tmp_path, cache_dir) -> None:
    if NO_TRITON_HERE is None:
        pytest.skip("Triton kernels can run here")
    command = [
        sys.executable, "-m", "anemo_like.cli.train", "--config-name=quickstart", *TINY_MODEL,
        "model.graph_attention_backend=triton", "model.strict_backends=true", "training.max_steps=1",
        f"system.paths.cache={cache_dir}", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert process.returncode == 2, process.stdout + process.stderr
    output = process.stdout + process.stderr
    assert "model.strict_backends is true and model.graph_attention_backend=triton" in output
    assert "Traceback" not in output

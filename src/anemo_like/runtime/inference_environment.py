"""``ANEMOI_INFERENCE_*`` environment overrides, read once at setup and applied to a built model.

- ``ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER`` / ``_PROCESSOR`` override one component's eval-mode chunking;
  ``ANEMOI_INFERENCE_NUM_CHUNKS`` is the default for both. Unset or empty: the configured chunking applies.
- ``ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND``: the sliding-window attention backend in eval mode.
- ``ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND``: the graph-attention backend of a loaded checkpoint.

The network never reads the environment: :func:`apply_inference_overrides` sets the eval-mode attributes of its
mappers, processors and window-attention layers.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal, get_args

from torch import nn

from anemo_like.config.schema import ModelConfig
from anemo_like.models.mapper import GraphTransformerMapper
from anemo_like.models.ops.window_attention import BACKENDS, Backend
from anemo_like.models.processor import GraphTransformerProcessor
from anemo_like.models.sliding_window import SlidingWindowTransformerLayer

LOG = logging.getLogger(__name__)
CHUNKS_VARIABLE = "ANEMOI_INFERENCE_NUM_CHUNKS"
TRANSFORMER_BACKEND_VARIABLE = "ANEMOI_INFERENCE_TRANSFORMER_ATTENTION_BACKEND"
GRAPH_BACKEND_VARIABLE = "ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND"


@dataclass(frozen=True)
class InferenceOverrides:
    """What the environment asks of eval-mode forwards (None: keep the configured value)."""

    mapper_chunks: int | None = None
    processor_chunks: int | None = None
    transformer_backend: Backend | None = None
    graph_backend: str | None = None
    mapper_chunks_variable: str = f"{CHUNKS_VARIABLE}_MAPPER"  # the variable that set mapper_chunks
    processor_chunks_variable: str = f"{CHUNKS_VARIABLE}_PROCESSOR"


def _variable(name: str) -> str:
    return os.environ.get(name, "").strip()


def _chunks_setting(component: Literal["MAPPER", "PROCESSOR"]) -> tuple[str, int | None]:
    """(variable that sets ``component``'s chunk count, the count or None when no variable is set)."""
    for name in (f"{CHUNKS_VARIABLE}_{component}", CHUNKS_VARIABLE):
        value = _variable(name)
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"environment variable {name}={value!r}: expected a positive integer")
            return name, int(value)
    return f"{CHUNKS_VARIABLE}_{component}", None


def inference_num_chunks(component: Literal["MAPPER", "PROCESSOR"]) -> int | None:
    """Chunk count requested for ``component``, or None when no variable is set."""
    return _chunks_setting(component)[1]


def _choice(name: str, allowed: tuple[str, ...]) -> str | None:
    value = _variable(name)
    if value and value not in allowed:
        raise ValueError(f"environment variable {name}={value!r}: expected one of {', '.join(allowed)}")
    return value or None


def read_inference_environment() -> InferenceOverrides:
    """The overrides the environment sets now; ValueError naming the variable for a bad value."""
    graph_backends = get_args(ModelConfig.model_fields["graph_attention_backend"].annotation)
    mapper_variable, mapper_chunks = _chunks_setting("MAPPER")
    processor_variable, processor_chunks = _chunks_setting("PROCESSOR")
    return InferenceOverrides(
        mapper_chunks=mapper_chunks,
        processor_chunks=processor_chunks,
        transformer_backend=_choice(TRANSFORMER_BACKEND_VARIABLE, BACKENDS),  # type: ignore[arg-type]
        graph_backend=_choice(GRAPH_BACKEND_VARIABLE, graph_backends),
        mapper_chunks_variable=mapper_variable,
        processor_chunks_variable=processor_variable,
    )


def check_inference_environment() -> None:
    """Fail at set-up, not mid-run, on a bad ``ANEMOI_INFERENCE_*`` variable."""
    read_inference_environment()


def with_graph_backend_from_environment(model: ModelConfig) -> ModelConfig:
    """``model`` with ``graph_attention_backend`` from ``ANEMOI_INFERENCE_GRAPHTRANSFORMER_ATTENTION_BACKEND``."""
    value = read_inference_environment().graph_backend
    if value is None:
        return model
    if value != model.graph_attention_backend:
        LOG.info(
            "graph attention backend %s (from %s; trained with %s)",
            value,
            GRAPH_BACKEND_VARIABLE,
            model.graph_attention_backend,
        )
    return model.model_copy(update={"graph_attention_backend": value})


def _check_chunks_fit(model: nn.Module, overrides: InferenceOverrides) -> None:
    """Refuse an eval-mode chunk count above the destination nodes a mapper or graph processor splits."""
    for name, module in model.named_modules():
        if isinstance(module, GraphTransformerMapper):
            count, nodes, variable = overrides.mapper_chunks, module.num_dst, overrides.mapper_chunks_variable
            what = "chunks than the {} destination nodes of the {}"
        elif isinstance(module, GraphTransformerProcessor):
            count, nodes, variable = overrides.processor_chunks, module.num_nodes, overrides.processor_chunks_variable
            what = "chunks than the {} nodes of the {}"
        else:
            continue
        if count is not None and count > nodes:
            raise ValueError(
                f"environment variable {variable}='{count}': more {what.format(nodes, name or 'model')}; set at most "
                f"{nodes} or unset it"
            )


def apply_inference_overrides(model: nn.Module, overrides: InferenceOverrides | None = None) -> nn.Module:
    """Set the eval-mode chunking and window-attention backend of ``model``'s modules from ``overrides`` (default:
    the environment now); returns ``model``."""
    overrides = overrides or read_inference_environment()
    _check_chunks_fit(model, overrides)
    for module in model.modules():
        if isinstance(module, GraphTransformerMapper):
            module.eval_num_chunks = overrides.mapper_chunks
        elif isinstance(module, GraphTransformerProcessor):
            module.eval_num_chunks = overrides.processor_chunks
        elif isinstance(module, SlidingWindowTransformerLayer):
            module.eval_backend = overrides.transformer_backend
    return model

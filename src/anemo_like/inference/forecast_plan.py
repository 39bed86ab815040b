"""The forecast's memory plan for ``memory_budget_gb`` on the CPU: the destination chunks of the mappers and the
processor, and whether the weights stay resident or are read from the checkpoint file part by part
(``runtime.weight_paging``), the fastest choice predicted to fit the budget.

Predicted peak = what the process holds now (interpreter, imports, the model without its weights, the dataset) + the
weights (all, or the largest part's when paged) + the forecast held until the write (and its copies at the write) +
the windows read + each step's outputs on the host + the forward's activations (``runtime.memory_model``) of the rows
run at a time. Fewer chunks and resident weights are
faster: the plan takes the fewest chunks in all, paging only when nothing fits without it. Chunk counts set by
``ANEMOI_INFERENCE_NUM_CHUNKS[_MAPPER|_PROCESSOR]`` are kept.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from anemo_like.checkpoints.inference import InferenceBundle
from anemo_like.config.inference import InferenceConfig
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.inference.memory_fit import ForecastMemory, forecast_sizes
from anemo_like.inference.parallel import InferenceRanks
from anemo_like.runtime.memory_model import component_models, eval_peak_bytes
from anemo_like.runtime.process_memory import current_memory_mib
from anemo_like.runtime.weight_paging import mapped_ranges, page_weights

LOG = logging.getLogger(__name__)
CHUNKS = (1, 2, 4, 8, 16, 32, 64)
OUTPUT_STEP_BYTES = 16
"""Per forecast row, grid point and output variable of a step: its normalised copy on the host and the denormalised
float64 values (measured at anemoi's default size on O96)."""
WRITE_COPIES = 2
"""The forecast held until the write is copied into the output dataset and encoded: twice its size at the write."""


@dataclass(frozen=True)
class ForecastPlan:
    """Chunk counts of the encoder, processor and decoder in eval mode, paging, and the predicted peak (bytes)."""

    encoder: int
    processor: int
    decoder: int
    paged: bool
    peak_bytes: int

    def describe(self) -> str:
        weights = "weights read part by part" if self.paged else "weights resident"
        chunks = f"encoder {self.encoder}, processor {self.processor}, decoder {self.decoder} chunks"
        return f"{chunks}, {weights}, predicted peak {self.peak_bytes / 2**20:.0f} MiB"


def _parts(model: nn.Module) -> list[nn.Module]:
    """What runs one after another: the encoder, each processor layer, the decoder."""
    return [model.encoder, *getattr(model.processor, "layers", [model.processor]), model.decoder]


def _bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _choices(module: nn.Module, limit: int) -> tuple[int, ...]:
    """The chunk counts to try for ``module``: the one the environment set, else those up to ``limit`` nodes (1 for
    a module without eval-mode chunks: the sliding-window processor)."""
    if not hasattr(module, "eval_num_chunks"):
        return (1,)
    return (module.eval_num_chunks,) if module.eval_num_chunks else tuple(n for n in CHUNKS if n <= limit)


def plan_forecast(
    config: InferenceConfig, *, bundle: InferenceBundle, inputs: ForecastInputs, ranks: InferenceRanks
) -> ForecastPlan | None:
    """The plan for ``memory_budget_gb`` (None without a budget, off the CPU or for a model sharded over ranks)."""
    model, device = bundle.model, next(bundle.model.parameters()).device
    if config.memory_budget_gb is None or device.type != "cpu" or ranks.groups.model_size > 1:
        return None
    memory = ForecastMemory.of(config, bundle, inputs, ranks)
    values = {size.key: size.value for size in forecast_sizes(config, inputs)}
    rows, itemsize = memory.rows(values), memory.itemsize
    base = int((current_memory_mib(device) or 0.0) * 2**20) + memory.held(values) + memory.read(values)
    base += rows * memory.window(values, itemsize) + rows * memory.points * memory.outputs * OUTPUT_STEP_BYTES
    base += WRITE_COPIES * memory.held(values)
    models = component_models(bundle.config.model, bundle.graph, 1)
    graph = bundle.graph
    choices = [
        _choices(model.encoder, graph["hidden"].num_nodes),
        _choices(model.processor, graph["hidden"].num_nodes),
        _choices(model.decoder, graph["data"].num_nodes),
    ]
    pageable = bool(mapped_ranges(Path(config.checkpoint).expanduser().absolute()))
    parts = [_bytes(part) for part in _parts(model)]
    weights = {False: _bytes(model), True: max(parts) + _bytes(model) - sum(parts)}  # paged: one part and the rest
    budget, plans = int(config.memory_budget_gb * 2**30), []
    for paged in (False, True) if pageable else (False,):
        for encoder, processor, decoder in itertools.product(*choices):
            forward = eval_peak_bytes(models, encoder, decoder, processor) * itemsize // 4
            peak = base + weights[paged] + rows * forward
            plans.append(ForecastPlan(encoder, processor, decoder, paged, peak))
    fitting = [plan for plan in plans if plan.peak_bytes <= budget]
    cost = lambda p: (p.paged, p.encoder + p.processor + p.decoder)  # noqa: E731
    return min(fitting, key=cost) if fitting else min(plans, key=lambda p: p.peak_bytes)


def apply_forecast_plan(plan: ForecastPlan, model: nn.Module, checkpoint: Path, budget_gb: float) -> None:
    """Set ``model``'s eval-mode chunk counts and, when the plan says so, page its weights."""
    model.encoder.eval_num_chunks, model.decoder.eval_num_chunks = plan.encoder, plan.decoder
    model.processor.eval_num_chunks = plan.processor
    if plan.paged:
        page_weights(model, checkpoint, _parts(model))
    fits = "" if plan.peak_bytes <= budget_gb * 2**30 else " (the leanest plan; above the budget)"
    LOG.info("memory plan for memory_budget_gb=%g: %s%s", budget_gb, plan.describe(), fits)

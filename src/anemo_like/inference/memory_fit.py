"""Refuse, before any forecast runs, an ``anemo-infer`` run whose forecasts cannot fit in memory
(``runtime.size_limits``).

The forecasts are held until the write: N initial dates x M members x L lead steps x G points x V output
variables, float32 (on rank 0, which gathers every copy's). They run ``batch_size`` at a time (at most a copy's
dates x members): each row reads its input window (multistep + L times x G points x the input variables) and goes
through the model without gradients (the memory model's peak, ``runtime.memory_model``), in the run's precision.
Both are compared with ``memory_budget_gb``, else the device's memory; on a GPU without a budget, the held
forecast and the windows read with the host's memory, the batch with the GPU's.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch

from anemo_like.checkpoints.inference import InferenceBundle
from anemo_like.config.inference import InferenceConfig
from anemo_like.data.zarr_store import format_frequency
from anemo_like.distributed.environment import rank_zero_memory
from anemo_like.inference.forecast import DTYPES
from anemo_like.inference.inputs import ForecastInputs
from anemo_like.inference.parallel import InferenceRanks
from anemo_like.runtime.memory_model import component_models, eval_peak_bytes
from anemo_like.runtime.size_limits import Size, check_sizes_fit, run_memory

MEMBERS, BATCH, DATES, LEAD = "members", "batch_size", "dates", "lead_time"
DAY = datetime.timedelta(days=1)
BUDGET_KEY = "memory_budget_gb"


def forecast_sizes(config: InferenceConfig, inputs: ForecastInputs) -> list[Size]:
    """Batch, members, initial dates and lead steps, in the order a refusal names them (the batch first: lowering it
    changes no forecast). A lead time of a day or more is cut to whole days where the model step divides a day."""
    dates, key = len(inputs.init_indices), "dates" if config.dates is not None else "date_range"
    per_day = DAY // inputs.step if DAY % inputs.step == datetime.timedelta(0) else 1
    return [
        Size(BATCH, config.batch_size, f"batch_size={config.batch_size}"),
        Size(MEMBERS, config.members, f"members={config.members}"),
        Size(
            DATES,
            dates,
            f"{key} ({dates} initial dates)",
            shown=lambda n: f"{n} initial dates",
            remedy=f"give fewer initial dates ({key})",
        ),
        Size(
            LEAD,
            inputs.steps,
            f"lead_time={config.lead_time}",
            shown=lambda steps: format_frequency(inputs.step * steps),
            remedy="shorten lead_time",
            step=per_day if inputs.steps >= per_day else 1,
        ),
    ]


@dataclass(frozen=True)
class ForecastMemory:
    """Bytes an ``anemo-infer`` run needs, for values of its sizes (by key)."""

    ranks: InferenceRanks
    points: int  # grid points
    outputs: int  # output variables
    window_row: int  # input variables x input states (lead steps come on top)
    multistep: int
    itemsize: int  # bytes per value in the run's precision
    model_row: int  # the forward's peak per forecast, in that precision

    @classmethod
    def of(
        cls, config: InferenceConfig, bundle: InferenceBundle, inputs: ForecastInputs, ranks: InferenceRanks
    ) -> ForecastMemory:
        """The sizes of ``inputs`` and the forward of ``bundle``'s model, in ``config``'s precision."""
        model, itemsize = bundle.model, DTYPES[config.precision].itemsize
        models = component_models(bundle.config.model, bundle.graph, 1)  # one fp32 row
        chunks = [mapper.eval_num_chunks or mapper.num_chunks for mapper in (model.encoder, model.decoder)]
        chunks.append(getattr(model.processor, "eval_num_chunks", None) or 1)
        return cls(
            ranks=ranks,
            points=inputs.store.shape[-1],
            outputs=len(inputs.roles.output),
            window_row=inputs.window_shape[1],
            multistep=inputs.multistep,
            itemsize=itemsize,
            model_row=eval_peak_bytes(models, *chunks) * itemsize // 4,
        )

    def rows(self, v: dict[str, int]) -> int:
        """Forecasts in a batch: ``batch_size``, at most rank 0's copy's dates (the most) x members."""
        start, stop = self.ranks.date_bounds(v[DATES])[0]
        return min(v[BATCH], (stop - start) * v[MEMBERS])

    def held(self, v: dict[str, int]) -> int:
        """The forecast held until the write (float32, on the host)."""
        return v[DATES] * v[MEMBERS] * v[LEAD] * self.points * self.outputs * 4

    def window(self, v: dict[str, int], itemsize: int) -> int:
        """One forecast's input window: its input states and lead times."""
        return (self.multistep + v[LEAD]) * self.points * self.window_row * itemsize

    def read(self, v: dict[str, int]) -> int:
        """The windows a batch reads on the host (float32), one per initial date in it."""
        return -(-self.rows(v) // v[MEMBERS]) * self.window(v, 4)

    def batch(self, v: dict[str, int]) -> int:
        """A batch on the device: its windows in the run's precision and its forward (per rank of a sharded copy)."""
        return self.rows(v) * (self.window(v, self.itemsize) + self.model_row) // self.ranks.groups.model_size


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("s" if n != 1 else "")


def check_forecasts_fit(
    config: InferenceConfig,
    *,
    bundle: InferenceBundle,
    inputs: ForecastInputs,
    ranks: InferenceRanks,
    device: torch.device,
) -> None:
    """Raise ValueError naming batch_size, members, the initial dates or lead_time when the forecasts cannot fit."""
    sizes, memory = forecast_sizes(config, inputs), ForecastMemory.of(config, bundle, inputs, ranks)
    values = {size.key: size.value for size in sizes}
    forecast = (
        f"the forecast of {_count(values[DATES], 'initial date')} x {_count(config.members, 'member')} x "
        f"{_count(inputs.steps, 'lead step')} held in"
    )
    through = f"{_count(memory.rows(values), 'forecast')} at a time through the model"
    if config.memory_budget_gb or device.type == "cpu":  # one memory (a CPU batch's windows are those it read)
        pools = [(lambda v: memory.held(v) + memory.batch(v), device, f"{forecast} memory, and {through}")]
    else:  # the forecast and the windows read are on the host
        host = (lambda v: memory.held(v) + memory.read(v), torch.device("cpu"), f"{forecast} host memory")
        pools = [host, (memory.batch, device, through)]
    for estimate, where, what in pools:
        available = rank_zero_memory(run_memory(config.memory_budget_gb, BUDGET_KEY, where), ranks.launch)
        check_sizes_fit(sizes, estimate, available=available, what=what, budget_key=BUDGET_KEY)

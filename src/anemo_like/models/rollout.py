"""Autoregressive rollout: feed predicted prognostic variables back, refresh forcings from the batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ForecastSpec:
    """Where the model's inputs and targets sit in a sample's variable axis.

    ``multistep`` past states feed each step; ``input_positions`` (V_in,) and ``output_positions`` (V_out,) index
    the sample's variables; both start with the ``num_prognostic`` prognostic variables, which are fed back.
    """

    multistep: int
    input_positions: Sequence[int] | Tensor
    output_positions: Sequence[int] | Tensor
    num_prognostic: int

    def on(self, device: torch.device | str) -> ForecastSpec:
        """The same spec with its positions as tensors on ``device`` (no host-to-device copy per step)."""
        return ForecastSpec(
            multistep=self.multistep,
            input_positions=torch.as_tensor(self.input_positions, device=device),
            output_positions=torch.as_tensor(self.output_positions, device=device),
            num_prognostic=self.num_prognostic,
        )


def rollout(
    model: nn.Module,
    batch: Tensor,
    spec: ForecastSpec,
    *,
    steps: int,
    gather: Callable[[Tensor], Tensor] | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (prediction, target) for ``steps`` autoregressive steps.

    batch: (B, multistep + steps, G, V_sample) normalised; prediction and target: (B, G, V_out). With ``gather``
    the batch holds this rank's block of the grid, (B, multistep + steps, g, V_sample), and ``gather`` makes the
    whole grid ((B, T, g, V) -> (B, T, G, V)) of the times each step reads, so no rank holds the whole batch.
    """
    inputs = torch.as_tensor(spec.input_positions, device=batch.device)
    outputs = torch.as_tensor(spec.output_positions, device=batch.device)

    def times(start: int, stop: int) -> Tensor:
        block = batch[:, start:stop]
        return block if gather is None else gather(block)

    x = times(0, spec.multistep).index_select(-1, inputs)
    for step in range(steps):
        prediction = model(x)
        time = spec.multistep + step
        sample = times(time, time + 1)[:, 0]
        yield prediction, sample.index_select(-1, outputs)
        if step + 1 < steps:
            known = sample.index_select(-1, inputs)
            state = torch.cat([prediction[..., : spec.num_prognostic], known[..., spec.num_prognostic :]], dim=-1)
            x = torch.cat([x[:, 1:], state.unsqueeze(1)], dim=1)

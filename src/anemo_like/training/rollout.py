"""Autoregressive rollout: feed predicted prognostic variables back, refresh forcings from the batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor, nn


def rollout(
    model: nn.Module,
    batch: Tensor,
    *,
    multistep: int,
    steps: int,
    input_positions: Sequence[int] | Tensor,
    output_positions: Sequence[int] | Tensor,
    num_prognostic: int,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (prediction, target) for ``steps`` autoregressive steps.

    batch: (B, multistep + steps, G, V_sample) normalised; prediction and target: (B, G, V_out).
    Input and output both start with the prognostic variables (``num_prognostic`` of them). Positions given as
    tensors on the batch's device are used as they are (no host-to-device copy per call).
    """
    inputs = torch.as_tensor(input_positions, device=batch.device)
    outputs = torch.as_tensor(output_positions, device=batch.device)
    x = batch[:, :multistep].index_select(-1, inputs)
    for step in range(steps):
        prediction = model(x)
        time = multistep + step
        yield prediction, batch[:, time].index_select(-1, outputs)
        if step + 1 < steps:
            known = batch[:, time].index_select(-1, inputs)
            state = torch.cat([prediction[..., :num_prognostic], known[..., num_prognostic:]], dim=-1)
            x = torch.cat([x[:, 1:], state.unsqueeze(1)], dim=1)

"""Autoregressive rollout: feed predicted prognostic variables back, refresh forcings from the batch."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class ForecastSpec:
    """Where the model's inputs and targets sit in a sample's variable axis.

    ``multistep`` past states feed each forward pass, which predicts the ``output_steps`` next states;
    ``input_positions`` (V_in,) and ``output_positions`` (V_out,) index the sample's variables; both start with the
    ``num_prognostic`` prognostic variables, which are fed back. ``forced`` (G,) bool marks the boundary points of a
    limited-area model: their predicted prognostic variables are replaced by the sample's (forced) values.
    """

    multistep: int
    input_positions: Sequence[int] | Tensor
    output_positions: Sequence[int] | Tensor
    num_prognostic: int
    output_steps: int = 1
    forced: Tensor | None = None

    def on(self, device: torch.device | str) -> ForecastSpec:
        """The same spec with its positions as tensors on ``device`` (no host-to-device copy per step)."""
        return ForecastSpec(
            multistep=self.multistep,
            input_positions=torch.as_tensor(self.input_positions, device=device),
            output_positions=torch.as_tensor(self.output_positions, device=device),
            num_prognostic=self.num_prognostic,
            output_steps=self.output_steps,
            forced=None if self.forced is None else self.forced.to(device),
        )


def rollout(
    model: nn.Module | Callable[..., Tensor],
    batch: Tensor,
    spec: ForecastSpec,
    *,
    steps: int,
    gather: Callable[[Tensor], Tensor] | None = None,
    noise: Callable[[int], Tensor] | None = None,
) -> Iterator[tuple[Tensor, Tensor]]:
    """Yield (prediction, target) for ``steps`` lead times, one model step apart.

    batch: (B, multistep + steps, G, V_sample) normalised; prediction and target: (B, G, V_out). Each forward pass
    gives ``spec.output_steps`` = K states ((B, G, V_out) for K = 1, else (B, K, G, V_out)), yielded one by one (of
    the last pass only those still needed); the next pass reads the last ``multistep`` states, predicted prognostic
    variables with the batch's known variables of their times. With ``gather`` the batch holds this rank's block of
    the grid, (B, multistep + steps, g, V_sample), and ``gather`` makes the whole grid ((B, T, g, V) -> (B, T, G,
    V)) of the times each step reads, so no rank holds the whole batch. ``noise(i)`` gives the processor noise of
    the i-th forward pass (ensemble models, :meth:`ForecastModel.forward`). With ``spec.forced`` the prognostic
    variables at the forced points of every predicted state are the sample's values of its time, before they are
    yielded and fed back (a limited-area model's boundary), and each forward pass reads them
    (:func:`boundary_inputs`).
    """
    inputs = torch.as_tensor(spec.input_positions, device=batch.device)
    outputs = torch.as_tensor(spec.output_positions, device=batch.device)

    def times(start: int, stop: int) -> Tensor:
        block = batch[:, start:stop]
        return block if gather is None else gather(block)

    x = times(0, spec.multistep).index_select(-1, inputs)
    done = passes = 0
    while done < steps:
        first = spec.multistep + done
        samples = list(times(first, first + min(spec.output_steps, steps - done)).unbind(1))
        targets = [sample.index_select(-1, outputs) for sample in samples]
        known = {} if spec.forced is None else {"boundary": boundary_inputs(targets, spec)}
        output = model(x, **known) if noise is None else model(x, noise(passes), **known)
        passes += 1
        states = output.unsqueeze(1) if spec.output_steps == 1 else output  # (B, K, G, V_out)
        for k, target in enumerate(targets):
            if spec.forced is not None:
                states = _force(states, k, target, spec)
            yield states[:, k], target
        done += len(samples)
        if done < steps:
            x = _next_inputs(x, states, samples, spec, inputs)


def boundary_inputs(targets: list[Tensor], spec: ForecastSpec) -> Tensor:
    """A limited-area model's extra inputs (B, G, K * V_prognostic + 1): the prognostic values of the K states one
    forward pass predicts, at ``spec.forced`` points (zero elsewhere, and for a state past the batch's last time),
    then the boundary mask. ``targets``: up to K of (B, G, V_out)."""
    forced = spec.forced[:, None]  # (G, 1); a forecast's interior beyond its initial time is unknown (NaN)
    values = [torch.where(forced, target[..., : spec.num_prognostic], 0.0) for target in targets]
    values += [torch.zeros_like(values[0])] * (spec.output_steps - len(values))
    return torch.cat([*values, forced.to(values[0].dtype).expand_as(values[0][..., :1])], dim=-1)


def _force(states: Tensor, k: int, target: Tensor, spec: ForecastSpec) -> Tensor:
    """``states`` (B, K, G, V_out) with state k's prognostic variables at ``spec.forced`` points taken from ``target``
    (B, G, V_out); out of place, so gradients flow to the interior only."""
    where = torch.zeros(states.shape[-2:], dtype=torch.bool, device=states.device)
    where[:, : spec.num_prognostic] = spec.forced[:, None]
    forced = torch.where(where, target.to(states.dtype), states[:, k])
    return torch.cat([states[:, :k], forced.unsqueeze(1), states[:, k + 1 :]], dim=1)


def _next_inputs(x: Tensor, states: Tensor, samples: list[Tensor], spec: ForecastSpec, inputs: Tensor) -> Tensor:
    """The last ``multistep`` states of ``x`` (B, T, G, V_in) followed by the K predicted ``states`` (B, K, G,
    V_out): predicted prognostic variables, the known variables of ``samples`` (K of (B, G, V_sample))."""
    fed = []
    for k in range(max(0, len(samples) - spec.multistep), len(samples)):
        known = samples[k].index_select(-1, inputs)
        fed.append(torch.cat([states[:, k, ..., : spec.num_prognostic], known[..., spec.num_prognostic :]], dim=-1))
    kept = x[:, len(fed) :]
    return torch.cat([kept, torch.stack(fed, dim=1)], dim=1)

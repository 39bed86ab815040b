"""A limited-area rollout: forced boundary points take the sample's values exactly, the interior depends on them."""

import torch
from torch import nn

from anemo_like.models.rollout import ForecastSpec, rollout

G, V = 12, 3  # points; sample variables: 2 prognostic, 1 forcing


class Mixer(nn.Module):
    """(B, T, G, V_in) -> (B, G, 2): every output point mixes every input point (as a graph model's layers do)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(G, G, generator=torch.Generator().manual_seed(0)) / G)
        self.channels = nn.Linear(V, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.channels(torch.einsum("hg,btgv->bhv", self.weight, x))


def spec(forced: torch.Tensor | None) -> ForecastSpec:
    return ForecastSpec(
        multistep=1, input_positions=[0, 1, 2], output_positions=[0, 1], num_prognostic=2, forced=forced
    )


def test_forced_points_take_the_sample_values_and_drive_the_interior() -> None:
    forced = torch.zeros(G, dtype=torch.bool)
    forced[[0, 1, 10, 11]] = True
    batch = torch.randn(2, 4, G, V, generator=torch.Generator().manual_seed(1))
    model = Mixer()
    steps = list(rollout(model, batch, spec(forced), steps=3))
    for prediction, target in steps:
        assert torch.equal(prediction[:, forced], target[:, forced])
    free = list(rollout(model, batch, spec(None), steps=3))
    assert not torch.allclose(free[1][0][:, ~forced], steps[1][0][:, ~forced])  # the boundary reached the interior
    changed = batch.clone()
    changed[:, 1, forced] += 1.0  # other forced values at the first lead time
    again = list(rollout(model, changed, spec(forced), steps=3))
    assert torch.equal(again[0][0][:, ~forced], steps[0][0][:, ~forced])  # the first step's interior: same inputs
    assert not torch.allclose(again[1][0][:, ~forced], steps[1][0][:, ~forced])  # the second: fed the new boundary


def test_no_gradient_reaches_the_model_through_forced_points() -> None:
    forced = torch.zeros(G, dtype=torch.bool)
    forced[:4] = True
    batch = torch.randn(1, 3, G, V, generator=torch.Generator().manual_seed(2))
    model = Mixer()
    (prediction, _), *_ = rollout(model, batch, spec(forced), steps=1)
    prediction[:, forced].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())

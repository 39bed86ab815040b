"""A limited-area rollout: forced boundary points take the sample's values exactly, every forward pass reads the
forced values of the states it predicts, and the interior depends on them."""

import dataclasses

import pytest
import torch
from test_model_sharding import LAYOUT, make_model
from test_regional_sharding import limited_area_graph
from torch import nn

from anemo_like.models.rollout import ForecastSpec, boundary_inputs, rollout

G, V = 12, 3  # points; sample variables: 2 prognostic, 1 forcing


class Mixer(nn.Module):
    """(B, T, G, V_in) and the boundary inputs (B, G, 2 K + 1) -> (B, G, 2), or (B, K, G, 2) for K > 1: every output
    point mixes every input point (as a graph model's layers do)."""

    def __init__(self, output_steps: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(G, G, generator=torch.Generator().manual_seed(0)) / G)
        self.channels = nn.Linear(V + 2 * output_steps + 1, 2 * output_steps)
        self.output_steps = output_steps

    def forward(self, x: torch.Tensor, boundary: torch.Tensor | None = None) -> torch.Tensor:
        if boundary is None:
            boundary = torch.zeros(*x.shape[:1], G, 2 * self.output_steps + 1)
        mixed = torch.einsum("hg,btgv->bhv", self.weight, x)
        out = self.channels(torch.cat([mixed, torch.einsum("hg,bgv->bhv", self.weight, boundary)], dim=-1))
        return out if self.output_steps == 1 else out.unflatten(-1, (self.output_steps, 2)).transpose(1, 2)


def spec(forced: torch.Tensor | None, output_steps: int = 1) -> ForecastSpec:
    return ForecastSpec(
        multistep=1,
        input_positions=[0, 1, 2],
        output_positions=[0, 1],
        num_prognostic=2,
        output_steps=output_steps,
        forced=forced,
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
    assert torch.equal(again[0][0][:, forced], changed[:, 1, forced, :2])
    for (before, _), (after, _) in zip(steps[:2], again[:2], strict=True):  # read, then fed back as well
        assert not torch.allclose(after[:, ~forced], before[:, ~forced])
    later = batch.clone()
    later[:, 3, forced] += 1.0  # the last lead time's forced values: read by its own forward pass only
    last = list(rollout(model, later, spec(forced), steps=3))
    assert all(torch.equal(a[0], b[0]) for a, b in zip(last[:2], steps[:2], strict=True))
    assert not torch.allclose(last[2][0][:, ~forced], steps[2][0][:, ~forced])


def test_boundary_inputs_hold_the_forced_values_of_each_predicted_state_and_the_mask() -> None:
    forced = torch.zeros(G, dtype=torch.bool)
    forced[[0, 5]] = True
    targets = [torch.randn(2, G, 2, generator=torch.Generator().manual_seed(k)) for k in range(2)]
    inputs = boundary_inputs(targets, spec(forced, output_steps=3))  # a last pass that needs 2 of its 3 states
    assert inputs.shape == (2, G, 3 * 2 + 1)
    for k, target in enumerate(targets):
        assert torch.equal(inputs[:, forced, 2 * k : 2 * k + 2], target[:, forced])
    assert not inputs[:, ~forced, :6].any() and not inputs[..., 4:6].any()
    assert torch.equal(inputs[..., 6], forced.float().expand(2, G))
    model = Mixer(output_steps=3)
    batch = torch.randn(1, 6, G, V, generator=torch.Generator().manual_seed(3))
    for prediction, target in rollout(model, batch, spec(forced, output_steps=3), steps=5):
        assert torch.equal(prediction[:, forced], target[:, forced])


def test_no_gradient_reaches_the_model_through_forced_points() -> None:
    forced = torch.zeros(G, dtype=torch.bool)
    forced[:4] = True
    batch = torch.randn(1, 3, G, V, generator=torch.Generator().manual_seed(2))
    model = Mixer()
    (prediction, _), *_ = rollout(model, batch, spec(forced), steps=1)
    prediction[:, forced].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_a_limited_area_model_reads_the_boundary_and_refuses_to_run_without_it() -> None:
    graph = limited_area_graph()
    lam = make_model(
        graph, "graphtransformer", "edges", "edges", layout=dataclasses.replace(LAYOUT, boundary_inputs=True)
    )
    plain = make_model(graph, "graphtransformer", "edges", "edges")
    grid = graph["data"].num_nodes
    x = torch.randn(1, 2, grid, LAYOUT.num_input, generator=torch.Generator().manual_seed(4))
    forced = torch.zeros(grid, dtype=torch.bool)
    forced[:5] = True
    lam_spec = ForecastSpec(multistep=2, input_positions=[0], output_positions=[0], num_prognostic=3, forced=forced)
    targets = [torch.randn(1, grid, LAYOUT.num_output, generator=torch.Generator().manual_seed(5))]
    boundary = boundary_inputs(targets, lam_spec)
    assert lam.boundary_channels == boundary.shape[-1] == 3 + 1
    with torch.no_grad():
        out = lam(x, boundary=boundary)
        other = lam(x, boundary=boundary_inputs([targets[0] + 1.0], lam_spec))
    assert not torch.allclose(out[:, ~forced], other[:, ~forced])  # the interior depends on the forced values
    with pytest.raises(ValueError, match="reads 4 boundary channels, got none"):
        lam(x)
    with pytest.raises(ValueError, match="reads 0 boundary channels"):
        plain(x, boundary=boundary)

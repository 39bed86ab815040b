"""Several output steps per forward pass (``training.multistep_output`` = K): the rollout still counts lead times,
a K-step forward equals K chained one-step forwards, the model's K heads, and a K = 2 run from training to
inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr
from torch import Tensor, nn

from anemo_like.checkpoints.training import resume_mismatches
from anemo_like.config.inference import validate_inference_config
from anemo_like.config.schema import ModelConfig
from anemo_like.inference.run import prepare, run
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.rollout import ForecastSpec, rollout
from anemo_like.training.trainer import Trainer

# sample variables: [p0, p1, forcing, diagnostic]; model input [p0, p1, forcing]; output [p0, p1, diagnostic]
INPUTS, OUTPUTS, PROGNOSTIC = [0, 1, 2], [0, 1, 3], 2
FORCING_STEP = 0.25  # the batch's forcing grows by this much per time: the stand-in model knows its future values


def one_step(x: Tensor) -> Tensor:
    """The one-step map: (B, T, G, 3) -> (B, G, 3); reads the last two states, the forcing included."""
    last, before = x[:, -1], x[:, -2]
    prognostic = 0.5 * last[..., :2] - 0.25 * before[..., :2] + last[..., 2:] + 1.0
    diagnostic = torch.tanh(last[..., :1] * before[..., 2:])
    return torch.cat([prognostic, diagnostic], dim=-1)


class Chained(nn.Module):
    """A K-step "model": K applications of :func:`one_step` (the same weights), each fed its predicted prognostics
    and the next forcing; (B, G, 3) for K = 1, else (B, K, G, 3). Counts its forward passes."""

    def __init__(self, output_steps: int) -> None:
        super().__init__()
        self.output_steps, self.calls = output_steps, 0

    def forward(self, x: Tensor) -> Tensor:
        self.calls += 1
        states = []
        for _ in range(self.output_steps):
            states.append(one_step(x))
            state = torch.cat([states[-1][..., :PROGNOSTIC], x[:, -1, :, PROGNOSTIC:] + FORCING_STEP], dim=-1)
            x = torch.cat([x[:, 1:], state.unsqueeze(1)], dim=1)
        return states[0] if self.output_steps == 1 else torch.stack(states, dim=1)


def sample_batch(multistep: int, steps: int) -> Tensor:
    """(2, multistep + steps, 5, 4): random prognostic and diagnostic values, a forcing ramp in time."""
    generator = torch.Generator().manual_seed(multistep * 10 + steps)
    batch = torch.randn(2, multistep + steps, 5, 4, generator=generator, dtype=torch.float64)
    start = torch.randint(-8, 8, (2, 1, 5), generator=generator).double() / 4
    batch[..., 2] = start + FORCING_STEP * torch.arange(multistep + steps).double()[None, :, None]
    return batch


def chained_by_hand(batch: Tensor, multistep: int, steps: int) -> list[tuple[Tensor, Tensor]]:
    """The one-step map chained ``steps`` times, forcings read from the batch: (prediction, target) per lead."""
    x, pairs = batch[:, :multistep][..., INPUTS], []
    for lead in range(steps):
        prediction, sample = one_step(x), batch[:, multistep + lead]
        pairs.append((prediction, sample[..., OUTPUTS]))
        state = torch.cat([prediction[..., :PROGNOSTIC], sample[..., PROGNOSTIC:3]], dim=-1)
        x = torch.cat([x[:, 1:], state.unsqueeze(1)], dim=1)
    return pairs


@pytest.mark.parametrize(("multistep", "output_steps"), [(2, 1), (2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5])
def test_k_step_forward_equals_k_chained_one_step_forwards(multistep: int, output_steps: int, steps: int) -> None:
    batch = sample_batch(multistep, steps)
    model = Chained(output_steps)
    spec = ForecastSpec(multistep, INPUTS, OUTPUTS, PROGNOSTIC, output_steps=output_steps)
    got = list(rollout(model, batch, spec, steps=steps))
    expected = chained_by_hand(batch, multistep, steps)
    assert len(got) == steps and model.calls == -(-steps // output_steps)  # the last forward may be cut
    for lead, ((prediction, target), (want, want_target)) in enumerate(zip(got, expected, strict=True)):
        assert prediction.shape == target.shape == (2, 5, 3), lead
        torch.testing.assert_close(prediction, want, rtol=1e-12, atol=1e-12, msg=f"lead {lead + 1}")
        torch.testing.assert_close(target, want_target, rtol=0, atol=0)


def test_the_spec_keeps_its_output_steps_on_a_device() -> None:
    assert ForecastSpec(2, INPUTS, OUTPUTS, PROGNOSTIC, output_steps=3).on("cpu").output_steps == 3


def test_multistep_output_must_match_to_resume() -> None:
    saved = {"training": {"multistep_input": 2, "multistep_output": 1}}
    current = {"training": {"multistep_input": 2, "multistep_output": 2}}
    assert resume_mismatches(saved, current) == ["training.multistep_output: 1 -> 2"]


# ------------------------------------------------------------------------------------------------ the model
LAYOUT = VariableLayout(
    num_input=5, num_output=4, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={3: -0.5}
)
HEAD = "decoder.head.1"  # the Linear of the decoder's LayerNorm + Linear head


def make_model(graph, output_steps: int) -> ForecastModel:
    torch.manual_seed(0)
    config = ModelConfig.model_validate({"num_channels": 16, "num_heads": 4, "processor": {"num_layers": 1}})
    return ForecastModel(config=config, graph=graph, layout=LAYOUT, multistep=2, output_steps=output_steps)


def test_two_output_steps_share_everything_but_the_head_and_each_is_a_residual_update(small_graph) -> None:
    one, two = make_model(small_graph, 1), make_model(small_graph, 2)
    shapes_one = {name: p.shape for name, p in one.state_dict().items()}
    shapes_two = {name: p.shape for name, p in two.state_dict().items()}
    assert shapes_one.keys() == shapes_two.keys()
    assert shapes_one[f"{HEAD}.weight"] == (4, 16) and shapes_two[f"{HEAD}.weight"] == (8, 16)
    assert {n: s for n, s in shapes_one.items() if not n.startswith(HEAD)} == {
        n: s for n, s in shapes_two.items() if not n.startswith(HEAD)
    }
    grid = small_graph["data"].num_nodes
    x = torch.randn(3, 2, grid, 5)
    with torch.no_grad():
        y_one, y_two = one(x), two(x)
        assert y_one.shape == (3, grid, 4) and y_two.shape == (3, 2, grid, 4)
        assert torch.all(y_two[..., 3] >= -0.5)
        shifted = x.clone()
        shifted[:, -1, :, 1] += 100.0
        assert ((two(shifted) - y_two)[..., 1].mean(dim=(0, 2)) > 50.0).all()  # both states: last state + change
        # the head's rows are state-major: K = 1 weights in the first rows give K = 1's state as the first state
        state = {n: p for n, p in one.state_dict().items() if not n.startswith(HEAD)}
        two.load_state_dict(state, strict=False)
        two.get_submodule(HEAD).weight[:4] = one.get_submodule(HEAD).weight
        two.get_submodule(HEAD).bias[:4] = one.get_submodule(HEAD).bias
        torch.testing.assert_close(two(x)[:, 0], y_one, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ training to inference, K = 2
K2_TRAINING = [
    "training.multistep_output=2",
    "training.rollout.start=3",
    "training.rollout.max=3",
    "training.val_rollout=3",
    "training.max_steps=2",
    "training.val_climatology_dates=0",
    "dataloader.limit_batches.val=1",
    "diagnostics.plots=false",
]


def test_a_two_output_step_run_trains_validates_and_forecasts(compose_run, tmp_path) -> None:
    run_dir = tmp_path / "run"
    Trainer(compose_run(run_dir, K2_TRAINING)).fit()
    table = (run_dir / "validation.md").read_text()
    assert all(f"| {lead} |" in table for lead in ("6h", "12h", "18h")) and "| 24h |" not in table
    config = validate_inference_config(
        {"checkpoint": str(run_dir / "inference.pt"), "dates": ["2000-11-03T06"], "lead_time": "30h", "device": "cpu"}
        | {"output": str(tmp_path / "forecast.zarr")}
    )
    prepared = prepare(config)
    run(prepared)
    model, inputs = prepared.bundle.model, prepared.inputs
    assert model.output_steps == 2 and inputs.output_steps == 2 and inputs.steps == 5
    # by hand: three forward passes of two states, both fed back (multistep 2) with the forcings of their times
    window = torch.from_numpy(inputs.window(int(inputs.init_indices[0])))  # (2 + 5, G, V_in) normalised
    x, expected, prognostic = window[None, :2], [], len(inputs.roles.prognostic)
    with torch.no_grad():
        for first in (2, 4, 6):
            states = model(x)  # (1, 2, G, V_out)
            expected += list(states[0])
            x = window[None, first : first + 2].clone()
            x[..., :prognostic] = states[:, : x.shape[1], ..., :prognostic]
    expected = inputs.output_normalizer.denormalize(torch.stack(expected[:5]).double().numpy(), axis=-1)
    with xr.open_zarr(tmp_path / "forecast.zarr") as ds:
        got = np.stack([ds[name].isel(time=0).values for name in inputs.roles.output], axis=-1)  # (L, G, V)
    assert got.shape == expected.shape and np.isfinite(got).all()
    scale = inputs.output_normalizer.scale
    np.testing.assert_allclose(got / scale, expected / scale, rtol=0, atol=1e-5)

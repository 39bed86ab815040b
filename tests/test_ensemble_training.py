"""Ensemble training: the stochastic model, its config rules, the rank layout, and a short ensemble run.

A deterministic config keeps today's model and loss exactly (no new parameter, the noise argument ignored, the
rollout loss the same sum); a stochastic model warm-started from a deterministic one forecasts exactly what it did
until its noise conditioning is trained.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from bad_input_helpers import N_DATES, N_LAT, N_LON, TINY_DATA, VARIABLES, tiny_grid
from conftest import latlon_graph

from anemo_like.config.schema import ModelConfig
from anemo_like.config.validate import ConfigError
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.window_dataset import WindowDataset
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.distributed.groups import group_layout
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.member_noise import member_noise, member_seed
from anemo_like.models.rollout import ForecastSpec, rollout
from anemo_like.training.ensemble import EnsembleMembers, rollout_loss
from anemo_like.training.loss import WeightedLoss
from anemo_like.training.trainer import Trainer

LAYOUT = VariableLayout(
    num_input=5, num_output=4, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={}
)
SPEC = ForecastSpec(multistep=2, input_positions=range(5), output_positions=range(4), num_prognostic=3)
SHORT = ["diagnostics.plots=false", "training.val_every_n_steps=1000", "dataloader.limit_batches.val=1"]
ENSEMBLE = ["training.ensemble.members=3", "training.loss.name=afcrps", "model.noise={channels: 4}"]


def model(noise: int | None, processor: str = "graphtransformer") -> ForecastModel:
    torch.manual_seed(0)
    config = {"num_channels": 16, "num_heads": 4, "processor": {"type": processor, "num_layers": 2, "window_size": 6}}
    if noise is not None:
        config["noise"] = {"channels": noise}
    return ForecastModel(config=ModelConfig.model_validate(config), graph=GRAPH, layout=LAYOUT, multistep=2)


GRAPH = latlon_graph(9, 16, 1)
X = torch.randn(2, 2, GRAPH["data"].num_nodes, 5, generator=torch.Generator().manual_seed(1))


def test_a_deterministic_model_has_no_noise_and_ignores_it() -> None:
    deterministic = model(None)
    assert deterministic.noise_shape(2) is None
    assert not [name for name, _ in deterministic.named_parameters() if "noise" in name or "modulation" in name]
    with torch.no_grad():
        assert torch.equal(deterministic(X, noise=torch.randn(2, 5, 3)), deterministic(X))


def test_the_deterministic_rollout_loss_is_the_plain_sum() -> None:
    net, area = model(None), torch.rand(GRAPH["data"].num_nodes) + 0.5
    loss_fn = WeightedLoss(area_weight=area, variable_weight=torch.ones(4))
    batch = torch.randn(2, 4, GRAPH["data"].num_nodes, 5)
    expected = torch.zeros(())
    for prediction, target in rollout(net, batch, SPEC, steps=2):
        expected = expected + loss_fn(prediction.float(), target.float()) / 2
    actual = rollout_loss(net, batch, spec=SPEC, loss_fn=loss_fn, steps=2, ensemble=None, step=0)
    assert torch.equal(actual, expected)


@pytest.mark.parametrize("members", [None, 2])
def test_lead_weights_make_the_rollout_loss_a_weighted_mean_of_the_leads(members) -> None:
    net, batch = model(None if members is None else 4), torch.randn(1, 5, GRAPH["data"].num_nodes, 5)
    if members is None:
        ensemble, loss_fn = (
            None,
            WeightedLoss(area_weight=torch.rand(batch.shape[2]) + 0.5, variable_weight=torch.ones(4)),
        )
    else:  # (B, M, G, V) members against (B, G, V)
        ensemble = EnsembleMembers.of(members=members, group=None, rank=0, size=1, seed=3)
        loss_fn = lambda members, target: (members - target.unsqueeze(1)).abs().mean()  # noqa: E731

    def loss(weights: list[float]) -> torch.Tensor:
        return rollout_loss(
            net, batch, spec=SPEC, loss_fn=loss_fn, steps=3, ensemble=ensemble, step=0, lead_weights=weights
        )

    plain, equal, tilted = loss([]), loss([2.0]), loss([3.0, 1.0])  # [3, 1] weighs leads 3 : 1 : 1
    with torch.no_grad():
        singles = [loss([1.0 if k == lead else 1e-30 for k in range(3)]) for lead in range(3)]
    torch.testing.assert_close(equal, plain, rtol=1e-6, atol=0)
    torch.testing.assert_close(tilted, (3 * singles[0] + singles[1] + singles[2]) / 5, rtol=1e-5, atol=0)
    assert not torch.isclose(tilted, plain, rtol=1e-3)


@pytest.mark.parametrize("processor", ["graphtransformer", "transformer"])
def test_an_untrained_noise_conditioning_keeps_the_deterministic_forecast(processor) -> None:
    deterministic, stochastic = model(None, processor), model(4, processor)
    missing, unexpected = stochastic.load_state_dict(deterministic.state_dict(), strict=False)
    assert not unexpected and all("noise_embedding" in k or "modulation" in k for k in missing)
    noise = torch.randn(stochastic.noise_shape(2))
    with torch.no_grad():
        assert torch.equal(stochastic(X, noise), deterministic(X))
        for name, p in stochastic.named_parameters():
            if "modulation" in name:
                p.normal_(std=0.1)
        first, again, other = stochastic(X, noise), stochastic(X, noise), stochastic(X, torch.randn_like(noise))
    assert torch.equal(first, again)
    assert (first - other).abs().max() > 1e-4


def test_member_noise_depends_on_the_member_and_step_not_on_the_rank() -> None:
    shape = (2, 7, 3)
    whole = EnsembleMembers.of(members=4, group=None, rank=0, size=1, seed=5)
    draws = whole.noise(shape, stream=0, step=9, device=torch.device("cpu"))(0).unflatten(0, (2, 4))
    for rank in range(2):  # the members of rank 1 of 2 are members 2 and 3 of the whole ensemble
        half = EnsembleMembers.of(members=4, group=None, rank=rank, size=2, seed=5)
        mine = half.noise(shape, stream=0, step=9, device=torch.device("cpu"))(0).unflatten(0, (2, 2))
        assert torch.equal(mine, draws[:, 2 * rank : 2 * rank + 2])
    assert not torch.equal(draws[:, 0], draws[:, 1])
    assert member_seed(5, 0, 9, 0) != member_seed(5, 0, 10, 0) != member_seed(5, 1, 9, 0)
    assert member_noise(None, seeds=[1], device=torch.device("cpu")) is None


def test_ensemble_groups_compose_with_model_and_data_parallel_groups() -> None:
    layout = group_layout(8, 2, None, 2)  # 2 replicas x 2 instances per ensemble x 2 ranks per instance
    assert layout.model == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.ensemble == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.data_parallel == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert group_layout(4, 2).data_parallel == ((0, 2), (1, 3))  # no ensemble: as before
    with pytest.raises(ValueError, match="num_gpus_per_ensemble=4 model instances of 2 rank"):
        group_layout(4, 2, None, 4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["training.ensemble.members=2", "model.noise={channels: 4}"], "needs an ensemble loss"),
        (["training.loss.name=crps"], "scores an ensemble: set ensemble.members to 2"),
        (["training.ensemble.members=2", "training.loss.name=crps"], "needs model.noise"),
        ([*ENSEMBLE, "system.hardware.num_gpus_per_ensemble=2"], "must divide training.ensemble.members"),
        (["training.loss.name=afcrps", "training.loss.alpha=1.5"], "alpha"),
        (["model.noise={channels: 4}"], "model.noise makes the processor stochastic"),
    ],
)
def test_ensemble_config_refusals(tmp_path, compose_run, overrides, message) -> None:
    with pytest.raises(ConfigError, match=message):
        compose_run(tmp_path, overrides)


def test_a_short_ensemble_run_scores_its_members(tmp_path, compose_run) -> None:
    run = [*SHORT, *ENSEMBLE, "training.max_steps=3", "training.val_rollout=2", "diagnostics.plots=true"]
    outputs = Trainer(compose_run(tmp_path, run)).fit()
    record = outputs.validation.as_record()
    assert {"crps_z_500_6h", "ssr_z_500_12h", "spread_t_850_6h", "ens_rmse_sp_12h"} <= set(record)
    assert record["spread_z_500_6h"] > 0
    assert record["ens_rmse_z_500_6h"] == pytest.approx(record["rmse_z_500_6h"])  # the mean is what RMSE scores
    table = (tmp_path / "validation.md").read_text()
    assert "Ensemble of 3 members" in table and "spread / skill" in table
    for png in ("rank_histogram.png", "spread_skill.png"):
        assert (tmp_path / png).stat().st_size > 1000


def ensemble_dataset(path, members: int):
    """A tiny anemoi dataset (test_bad_inputs' grid and variables) with ``members`` ensemble members, member e's
    values offset by 10 e."""
    latitudes, longitudes = tiny_grid()
    data = np.random.default_rng(0).normal(size=(N_DATES, len(VARIABLES), members, N_LAT * N_LON))
    data += 10.0 * np.arange(members)[None, None, :, None]
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h")
    return write_anemoi_zarr(
        path, data=data, variables=VARIABLES, dates=dates, latitudes=latitudes, longitudes=longitudes, frequency="6h"
    )


def test_members_start_from_the_dataset_members(tmp_path) -> None:
    store = open_anemoi_zarr(ensemble_dataset(tmp_path / "ens.zarr", 3))
    names = ["sp", "t_850"]
    normalizer = Normalizer(names=names, offset=np.zeros(2), scale=np.ones(2))
    window = {"store": store, "date_start": 0, "date_stop": 10, "stride": 1, "num_states": 4, "read_names": names}
    common = {**window, "computed_names": [], "normalizer": normalizer, "input_states": 2}
    plain = WindowDataset(**common)
    dataset = WindowDataset(**common, initial_members=2)
    item = dataset[3]  # (4 + 1 * 2, G, V): member 0's window, then member 1's two initial states
    assert item.shape == (6, N_LAT * N_LON, 2)
    assert torch.equal(item[:4], plain[3])
    member_one = store.read(slice(3, 5), store.variable_indices(names), ensemble=1)  # (2, V, G)
    assert torch.equal(item[4:], torch.from_numpy(member_one.transpose(0, 2, 1)))

    batch = torch.stack([dataset[3], dataset[5]])
    for rank in range(2):  # members 0..3 over 2 ranks: member k starts from dataset member k mod 2
        members = EnsembleMembers.of(members=4, group=None, rank=rank, size=2, seed=0, initial_members=2)
        rows = members.expand(batch, 2).unflatten(0, (2, 2))  # (B, m, T, G, V)
        assert rows.shape == (2, 2, 4, N_LAT * N_LON, 2)
        for j, k in enumerate(range(2 * rank, 2 * rank + 2)):
            start = batch[:, :2] if k % 2 == 0 else batch[:, 4:]
            assert torch.equal(rows[:, j, :2], start)
            assert torch.equal(rows[:, j, 2:], batch[:, 2:4])  # targets: member 0's


def test_an_ensemble_run_on_an_ensemble_dataset(tmp_path, compose_run, caplog) -> None:
    path = ensemble_dataset(tmp_path / "ens.zarr", 2)
    run = [f"data.dataset={path}", *TINY_DATA, *ENSEMBLE, "dataloader.limit_batches.val=1", "training.val_rollout=1"]
    with caplog.at_level(logging.INFO, logger="anemo_like.training.setup"):
        outputs = Trainer(compose_run(tmp_path / "run", run)).fit()
    assert "start from the initial states of 2 dataset members" in caplog.text
    assert np.isfinite(outputs.validation.loss)

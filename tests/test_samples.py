"""Training samples: windows, variable roles, normalisation round trip and computed forcings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from anemo_like.config.schema import VariablesConfig
from anemo_like.data.forcings import computed_forcings
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.variables import VariableRoles
from anemo_like.data.window_dataset import WindowDataset
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.models.rollout import ForecastSpec, rollout

VARIABLES = ["a", "b", "lsm", "tp"]


@pytest.fixture(params=[2, 3], ids=["zarr-v2", "zarr-v3"])
def store(request, tmp_path):
    rng = np.random.default_rng(0)
    data = rng.normal(size=(20, 4, 1, 6)).astype(np.float32) * [[[10.0]], [[2.0]], [[1.0]], [[5.0]]] + 3.0
    dates = np.arange(20) * np.timedelta64(6, "h") + np.datetime64("2001-01-01T00:00:00", "s")
    path = write_anemoi_zarr(
        tmp_path / "d.zarr",
        data=data,
        variables=VARIABLES,
        dates=dates,
        latitudes=np.linspace(-60, 60, 6),
        longitudes=np.linspace(0, 300, 6),
        frequency="6h",
        zarr_format=request.param,
    )
    return open_anemoi_zarr(path), data


def test_normalizer_round_trip_for_every_method(store) -> None:
    zarr_store, data = store
    index = zarr_store.variable_indices(VARIABLES)
    stats = {k: v[index] for k, v in zarr_store.statistics.items()}
    values = data[:, :, 0, :]
    for method in ("mean-std", "min-max", "none"):
        normalizer = Normalizer.from_statistics(names=VARIABLES, statistics=stats, methods=[method] * 4, source="t")
        normalized = normalizer.normalize(values, axis=1)
        np.testing.assert_allclose(normalizer.denormalize(normalized, axis=1), values, rtol=1e-5, atol=1e-4)
        if method == "mean-std":
            np.testing.assert_allclose(normalized.mean(axis=(0, 2)), 0, atol=1e-5)
            np.testing.assert_allclose(normalized.std(axis=(0, 2)), 1, atol=1e-4)
        if method == "min-max":
            assert normalized.min() >= -1e-6 and normalized.max() <= 1 + 1e-6


def test_zero_stdev_is_refused_with_variable_named() -> None:
    stats = {"mean": np.zeros(2), "stdev": np.array([1.0, 0.0]), "minimum": np.zeros(2), "maximum": np.ones(2)}
    with pytest.raises(ValueError, match="variable 'y' has unusable statistics"):
        Normalizer.from_statistics(names=["x", "y"], statistics=stats, methods=["mean-std"] * 2, source="file.zarr")


def test_window_dataset_reads_the_right_dates_variables_and_values(store) -> None:
    zarr_store, data = store
    roles = VariableRoles.from_config(
        VariablesConfig(prognostic=["b", "a"], forcing=["lsm"], diagnostic=["tp"], computed_forcing=["cos_local_time"])
    )
    index = zarr_store.variable_indices(roles.read)
    normalizer = Normalizer.from_statistics(
        names=roles.read,
        statistics={k: v[index] for k, v in zarr_store.statistics.items()},
        methods=["mean-std"] * 4,
        source="t",
    )
    dataset = WindowDataset(
        store=zarr_store,
        date_start=4,
        date_stop=16,
        stride=2,
        num_states=3,
        read_names=roles.read,
        computed_names=roles.computed,
        normalizer=normalizer,
    )
    assert len(dataset) == 12 - 4  # windows span 4 dates: starts 4..11
    sample = dataset[5]  # dates 9, 11, 13
    assert sample.shape == (3, 6, 5)
    expected = normalizer.normalize(data[[9, 11, 13]][:, index, 0, :], axis=1).transpose(0, 2, 1)
    np.testing.assert_allclose(sample[..., :4].numpy(), expected, rtol=1e-5, atol=1e-6)
    hours = np.array([9, 11, 13]) * 6 % 24
    local = np.cos(2 * np.pi * (hours[:, None] / 24 + np.linspace(0, 300, 6)[None, :] / 360))
    np.testing.assert_allclose(sample[..., 4].numpy(), local, atol=1e-6)
    assert list(dataset.dates(5)) == list(zarr_store.dates[[9, 11, 13]])
    with pytest.raises(IndexError):
        dataset[8]
    assert roles.input == ["b", "a", "lsm", "cos_local_time"] and roles.output == ["b", "a", "tp"]


def test_julian_day_forcing_turns_once_a_year_of_365_25_days_as_earthkit_computes_it() -> None:
    dates = np.arange(
        np.datetime64("2000-12-30T00", "s"), np.datetime64("2002-01-02T00", "s"), np.timedelta64(6, "h")
    )  # across a leap-year end and a normal one
    values = computed_forcings(["cos_julian_day", "sin_julian_day"], dates, np.zeros(1), np.zeros(1))[:, :, 0]
    angle = np.unwrap(np.arctan2(values[:, 1], values[:, 0]))
    steps = np.diff(angle)
    six_hours = 2 * np.pi * 0.25 / 365.25
    new_year = dates[1:].astype("datetime64[Y]") != dates[:-1].astype("datetime64[Y]")
    np.testing.assert_allclose(steps[~new_year], six_hours, rtol=0, atol=1e-6)  # float32 sin, cos
    # a 365.25-day turn restarted at 0 each 1 January: 31 December 18:00 is half a day past a full turn in a leap
    # year, half a day short of one otherwise
    np.testing.assert_allclose(steps[new_year], [-2 * six_hours, 2 * six_hours], rtol=0, atol=1e-6)
    mid_year = np.flatnonzero(dates == np.datetime64("2001-07-02T12", "s"))[0]
    assert values[mid_year, 0] < -0.99  # half a turn after new year


def test_rollout_feeds_prognostics_back_and_refreshes_forcings() -> None:
    class Echo(torch.nn.Module):
        """Predicts input[-1] + 1 for prognostics and 7 for the diagnostic; records what it saw."""

        def __init__(self) -> None:
            super().__init__()
            self.seen = []

        def forward(self, x):
            self.seen.append(x.clone())
            return torch.cat([x[:, -1, :, :2] + 1, torch.full_like(x[:, -1, :, :1], 7.0)], dim=-1)

    # sample variables: [p0, p1, forcing, diagnostic]; input [p0, p1, forcing]; output [p0, p1, diagnostic]
    batch = torch.arange(5 * 3 * 4, dtype=torch.float32).reshape(1, 5, 3, 4)
    model = Echo()
    spec = ForecastSpec(multistep=2, input_positions=[0, 1, 2], output_positions=[0, 1, 3], num_prognostic=2)
    steps = list(rollout(model, batch, spec, steps=3))
    assert len(steps) == 3
    torch.testing.assert_close(steps[0][1], batch[:, 2][..., [0, 1, 3]])
    second_input_last = model.seen[1][:, -1]
    torch.testing.assert_close(second_input_last[..., :2], batch[:, 1, :, :2] + 1)  # predicted prognostics
    torch.testing.assert_close(second_input_last[..., 2], batch[:, 2, :, 2])  # forcing from the batch
    torch.testing.assert_close(model.seen[2][:, 0], model.seen[1][:, 1])  # window shifted by one

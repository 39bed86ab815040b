"""Training losses (training.loss) and their weights (training.scalers), each against a direct numpy computation."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from bad_input_helpers import N_DATES, N_LAT, N_LON, config_error, tiny_grid
from conftest import SHARED_DATASET

from anemo_like.config.loss_schema import LossConfig, NodeMask, NodeScaler, PressureLevelScaler, TendencyScaler
from anemo_like.data.setup import setup_data
from anemo_like.data.zarr_store import open_anemoi_zarr, read_tendency_stdev
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.training.loss import WeightedLoss, WeightedMSE, pointwise_error
from anemo_like.training.scalers import (
    build_loss,
    node_weights,
    pressure_level_factors,
    tendency_factors,
)
from anemo_like.training.trainer import Trainer

FORCINGS = ["cos_latitude", "sin_latitude", "cos_longitude", "sin_longitude"]
VARIABLES = [*FORCINGS, "sp", "t_850", "z_500", "ta", "w_300"]
TRAIN_DATES = 16  # of the N_DATES 6-hourly dates from 2000-01-01T00
METADATA = {  # ta's level is only in its metadata; w_300 has none (its level comes from its name)
    "sp": {"mars": {"param": "sp", "levtype": "sfc"}},
    "t_850": {"mars": {"param": "t", "levtype": "pl", "levelist": 850}},
    "z_500": {"mars": {"param": "z", "levtype": "pl", "levelist": 500}},
    "ta": {"mars": {"param": "t", "levtype": "pl", "levelist": 700}},
}
LEVELS = {"sp": None, "t_850": 850.0, "z_500": 500.0, "ta": 700.0, "w_300": 300.0}
TINY = [
    "data.variables.prognostic=[sp,t_850,z_500,ta]",
    "data.variables.diagnostic=[w_300]",
    "data.splits.train.end='2000-01-04T18'",
    "data.splits.val.start='2000-01-05T00'",
    "training.multistep_input=1",
    "diagnostics.plots=false",
]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    """A small anemoi-format dataset with mars metadata for some variables; each variable moves at its own pace."""
    latitudes, longitudes = tiny_grid()
    rng = np.random.default_rng(0)
    walk = np.cumsum(rng.normal(size=(N_DATES, len(VARIABLES), 1, N_LAT * N_LON)), axis=0)
    data = walk * np.arange(1, len(VARIABLES) + 1)[:, None, None] + rng.normal(size=walk.shape)
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h")
    return write_anemoi_zarr(
        tmp_path_factory.mktemp("data") / "tiny.zarr",
        data=data,
        variables=VARIABLES,
        dates=dates,
        latitudes=latitudes,
        longitudes=longitudes,
        frequency="6h",
        attrs={"variables_metadata": METADATA},
    )


@pytest.fixture
def tiny_config(tmp_path, compose_run, dataset):
    def tiny_config(*overrides: str, data: Path = dataset):
        return compose_run(tmp_path / "run", [f"data.dataset={data}", *TINY, *overrides])

    return tiny_config


# ------------------------------------------------------------------------------------------------------ losses
def numpy_loss(prediction, target, area, variable, error) -> float:
    """sum_v w_v / sum(w) * sum_{b,g} a_g e(d) / sum_{b,g} a_g over the finite targets, in float64."""
    prediction, target = prediction.double().numpy(), target.double().numpy()
    area, variable = area.double().numpy(), variable.double().numpy()
    total = 0.0
    for v in range(target.shape[-1]):
        valid = np.isfinite(target[..., v])
        d = (prediction[..., v] - target[..., v])[valid]
        a = np.broadcast_to(area, valid.shape)[valid]
        total += variable[v] / variable.sum() * (a * error(d)).sum() / a.sum()
    return total


def huber(d: np.ndarray, delta: float) -> np.ndarray:
    return np.where(np.abs(d) <= delta, 0.5 * d**2, delta * (np.abs(d) - 0.5 * delta))


ERRORS = {"mse": np.square, "mae": np.abs, "huber": lambda d: huber(d, 0.7)}


@pytest.fixture
def case():
    """prediction, target (2, 50, 3) with missing targets; area (50,) and variable (3,) weights."""
    generator = torch.Generator().manual_seed(0)
    prediction = torch.randn(2, 50, 3, generator=generator) * 2
    target = torch.randn(2, 50, 3, generator=generator)
    target[0, :7, 1] = float("nan")
    target[1, 3, 2] = float("inf")
    area = torch.rand(50, generator=generator) + 0.1
    variable = torch.tensor([1.0, 0.5, 2.0])
    return prediction, target, area, variable


@pytest.mark.parametrize("name", ["mse", "mae", "huber"])
def test_each_loss_is_the_weighted_mean_of_its_error(case, name) -> None:
    prediction, target, area, variable = case
    config = LossConfig(name=name, huber_delta=0.7)
    loss = WeightedLoss.from_config(config, area_weight=area, variable_weight=variable)
    value = loss(prediction.requires_grad_(), target)
    assert value.item() == pytest.approx(numpy_loss(prediction.detach(), target, area, variable, ERRORS[name]), 1e-6)
    value.backward()
    assert prediction.grad.isfinite().all() and (prediction.grad[0, :7, 1] == 0).all()  # missing: no gradient


def test_huber_is_squared_inside_delta_and_absolute_outside() -> None:
    d = torch.tensor([-3.0, -0.5, -0.2, 0.0, 0.3, 0.5, 2.0])
    got = pointwise_error("huber", d, huber_delta=0.5)
    expected = [0.5 * (3.0 - 0.25), 0.125, 0.02, 0.0, 0.045, 0.125, 0.5 * (2.0 - 0.25)]
    assert got.tolist() == pytest.approx(expected)
    assert torch.allclose(got, torch.nn.functional.huber_loss(d, torch.zeros_like(d), reduction="none", delta=0.5))


def test_combined_is_the_weighted_sum_of_its_terms(case) -> None:
    prediction, target, area, variable = case
    terms = [{"name": "mse", "weight": 1.0}, {"name": "mae", "weight": 0.5}, {"name": "huber", "weight": 0.25}]
    combined = WeightedLoss.from_config(
        LossConfig(name="combined", terms=terms, huber_delta=0.7), area_weight=area, variable_weight=variable
    )
    parts = {
        name: WeightedLoss.from_config(
            LossConfig(name=name, huber_delta=0.7), area_weight=area, variable_weight=variable
        )
        for name in ("mse", "mae", "huber")
    }
    expected = sum(term["weight"] * parts[term["name"]](prediction, target) for term in terms)
    assert combined(prediction, target).item() == pytest.approx(expected.item(), rel=1e-6)
    assert combined.describe() == "1 mse + 0.5 mae + 0.25 huber(delta 0.7)"


def old_weighted_mse(prediction, target, area_weight, variable_weight):
    """The loss before training.loss existed, verbatim: mse must keep its numbers (and resumes)."""
    area_weight, variable_weight = area_weight / area_weight.mean(), variable_weight / variable_weight.sum()
    valid = target.isfinite()
    squared = torch.where(valid, prediction - target, 0.0).square()
    area = area_weight[:, None]
    weighted_sum = (squared * area).sum((0, 1))
    weight_sum = (valid * area).sum((0, 1))
    return (weighted_sum / weight_sum.clamp_min(torch.finfo(weight_sum.dtype).tiny)) @ variable_weight


def test_mse_gives_exactly_the_old_numbers(case) -> None:
    prediction, target, area, variable = case
    old = old_weighted_mse(prediction, target, area, variable)
    assert torch.equal(WeightedMSE(area_weight=area, variable_weight=variable)(prediction, target), old)
    default = WeightedLoss.from_config(LossConfig(), area_weight=area, variable_weight=variable)
    assert torch.equal(default(prediction, target), old)


# ----------------------------------------------------------------------------------------------------- scalers
@pytest.mark.parametrize("kind", ["linear", "relu"])
def test_pressure_level_factors_come_from_the_metadata(dataset, kind) -> None:
    store = open_anemoi_zarr(dataset)
    names = ["sp", "t_850", "z_500", "ta", "w_300"]
    config = PressureLevelScaler(kind=kind, slope=0.002, minimum=0.9)
    factors, from_names = pressure_level_factors(config, store, names)
    levels = np.array([np.nan if LEVELS[n] is None else LEVELS[n] for n in names])
    scaled = 0.002 * levels if kind == "linear" else np.maximum(0.9, 0.002 * levels)
    np.testing.assert_allclose(factors, np.where(np.isnan(levels), 1.0, scaled))
    assert from_names == ["w_300"]  # ta's level (700) is its metadata's: its name has none
    assert pressure_level_factors(PressureLevelScaler(), store, names)[0].tolist() == [1.0] * 5


@pytest.mark.skipif(not SHARED_DATASET.exists(), reason=f"the shared dataset {SHARED_DATASET} is not present")
def test_shared_dataset_levels_and_tendencies_are_read_from_it() -> None:
    store = open_anemoi_zarr(SHARED_DATASET)
    factors, from_names = pressure_level_factors(PressureLevelScaler(kind="relu"), store, ["sp", "t_250", "z_500"])
    assert factors.tolist() == pytest.approx([1.0, 0.25, 0.5]) and from_names == []
    stored = zarr.open_group(SHARED_DATASET, mode="r")["statistics_tendencies_6h_stdev"][:]
    np.testing.assert_array_equal(read_tendency_stdev(store, store.frequency), stored)


def expected_tendency(path: Path, names: list[str], power: int) -> np.ndarray:
    """(stdev / stdev of the 6 h change over the training dates)^power, from the raw data array."""
    values = zarr.open_group(path, mode="r")["data"][:TRAIN_DATES, :, 0].astype(np.float64)  # (T, V, G)
    stdev = zarr.open_group(path, mode="r")["stdev"][:]
    index = [VARIABLES.index(n) for n in names]
    change = np.diff(values, axis=0)[:, index]
    return (stdev[index] / change.std(axis=(0, 2))) ** power


@pytest.mark.parametrize(("kind", "power"), [("variance", 2), ("stdev", 1)])
def test_tendency_factors_computed_from_the_training_split(tiny_config, dataset, kind, power) -> None:
    config = tiny_config()
    data = setup_data(config)
    factors, source = tendency_factors(TendencyScaler(kind=kind), config, data)
    prognostic = ["sp", "t_850", "z_500", "ta"]
    np.testing.assert_allclose(factors[:4], expected_tendency(dataset, prognostic, power), rtol=1e-6)
    assert factors[4] == 1.0  # w_300 is diagnostic: no tendency
    assert source == f"{TRAIN_DATES - 1} date pairs of the training split"
    few, source = tendency_factors(TendencyScaler(kind=kind, max_dates=4), config, data)
    assert source == "4 date pairs of the training split" and np.isfinite(few).all()


def test_tendency_factors_use_the_dataset_statistics(tmp_path, tiny_config, dataset) -> None:
    copy = tmp_path / "with-tendencies.zarr"
    data_array = zarr.open_group(dataset, mode="r")["data"][:]
    latitudes, longitudes = tiny_grid()
    dates = np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h")
    arguments = {"latitudes": latitudes, "longitudes": longitudes, "attrs": {"variables_metadata": METADATA}}
    write_anemoi_zarr(copy, data=data_array, variables=VARIABLES, dates=dates, frequency="6h", **arguments)
    stored = np.linspace(0.5, 4.5, len(VARIABLES))
    zarr.open_group(copy, mode="r+").create_array("statistics_tendencies_6h_stdev", data=stored)
    config = tiny_config(data=copy)
    data = setup_data(config)
    factors, source = tendency_factors(TendencyScaler(kind="variance"), config, data)
    index = [VARIABLES.index(n) for n in ["sp", "t_850", "z_500", "ta"]]
    stdev = zarr.open_group(copy, mode="r")["stdev"][:]
    np.testing.assert_allclose(factors, [*(stdev[index] / stored[index]) ** 2, 1.0], rtol=1e-6)
    assert source == "the dataset's tendency statistics"

    stored[VARIABLES.index("z_500")] = 0.0
    zarr.open_group(copy, mode="r+")["statistics_tendencies_6h_stdev"][:] = stored
    with pytest.raises(ValueError, match=r"training.scalers.tendency: the 6h change of .* z_500 \(0\)"):
        tendency_factors(TendencyScaler(kind="variance"), config, setup_data(config))

    group = zarr.open_group(copy, mode="r+")
    del group["statistics_tendencies_6h_stdev"]
    group.create_array("statistics_tendencies_6h_stdev", data=stored[:3])  # not one value per variable
    with pytest.raises(ValueError) as error:
        tendency_factors(TendencyScaler(kind="variance"), config, setup_data(config))
    assert str(error.value) == (
        f"{copy.resolve()}: 'statistics_tendencies_6h_stdev' has shape (3,); expected ({len(VARIABLES)},)"
    )


@pytest.mark.parametrize(
    ("latitude", "longitude"), [((-50.0, 20.0), (40.0, 200.0)), ((0.0, 90.0), (300.0, 45.0)), ((-90, 90), (-60, 30))]
)
def test_node_mask_keeps_the_box(dataset, latitude, longitude) -> None:
    store = open_anemoi_zarr(dataset)
    area = torch.rand(N_LAT * N_LON, generator=torch.Generator().manual_seed(1)) + 0.5
    lat, lon = store.latitudes, store.longitudes
    west, east = longitude[0] % 360, longitude[1] % 360
    in_lon = (lon >= west) & (lon <= east) if west < east else (lon >= west) | (lon <= east)
    inside = (lat >= latitude[0]) & (lat <= latitude[1]) & in_lon
    assert 0 < inside.sum() < inside.size
    mask = NodeMask(latitude=latitude, longitude=longitude)
    got = node_weights(NodeScaler(mask=mask), area_weight=area, store=store)
    np.testing.assert_array_equal(got.numpy(), np.where(inside, area.numpy(), 0.0))
    uniform = node_weights(NodeScaler(weights="uniform", mask=mask), area_weight=area, store=store)
    np.testing.assert_array_equal(uniform.numpy(), inside.astype(np.float32))
    assert node_weights(NodeScaler(), area_weight=area, store=store) is area


def test_empty_mask_is_refused(dataset) -> None:
    mask = NodeMask(latitude=(89.0, 90.0), longitude=(0.0, 10.0))
    with pytest.raises(ValueError, match=r"training.scalers.nodes.mask: no grid point of .* latitude \[89.0, 90.0\]"):
        node_weights(NodeScaler(mask=mask), area_weight=torch.ones(N_LAT * N_LON), store=open_anemoi_zarr(dataset))


def test_build_loss_multiplies_the_weights_and_logs_them(tiny_config, caplog) -> None:
    weights = ("+training.variable_loss_weights.sp=2.0", "+training.variable_loss_weights.z_500=0.5")
    plain_config = tiny_config(*weights)
    data = setup_data(plain_config)
    area = torch.rand(N_LAT * N_LON, generator=torch.Generator().manual_seed(2)) + 0.5
    plain = build_loss(plain_config, data, area)  # the defaults: today's loss
    reference = WeightedMSE(area_weight=area, variable_weight=torch.tensor([2.0, 1.0, 0.5, 1.0, 1.0]))
    assert torch.equal(plain.variable_weight, reference.variable_weight)
    assert torch.equal(plain.area_weight, reference.area_weight)

    scaled_config = tiny_config(
        *weights, "training.scalers.pressure_level.kind=relu", "training.scalers.tendency.kind=variance"
    )
    with caplog.at_level(logging.INFO, logger="anemo_like.training.scalers"):
        scaled = build_loss(scaled_config, data, area)
    levels = np.array([1.0, 0.85, 0.5, 0.7, 0.3])
    tendency = np.array([*expected_tendency(data.store.path, ["sp", "t_850", "z_500", "ta"], 2), 1.0])
    expected = np.array([2.0, 1.0, 0.5, 1.0, 1.0]) * levels * tendency
    np.testing.assert_allclose(scaled.variable_weight.numpy(), expected / expected.sum(), rtol=1e-5)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("loss ")]
    assert len(lines) == 1 and "pressure_level relu" in lines[0] and "levels of w_300 from their names" in lines[0]
    assert f"sp {expected[0] / expected.sum():.4g}" in lines[0]


def test_a_combined_masked_run_trains(tiny_config) -> None:
    overrides = [
        "training.max_steps=2",
        "training.loss.name=combined",
        "training.loss.terms=[{name: mse, weight: 1.0}, {name: huber, weight: 0.5}]",
        "training.scalers.nodes.mask={latitude: [-60, 60], longitude: [300, 90]}",
        "training.scalers.pressure_level.kind=linear",
    ]
    outputs = Trainer(tiny_config(*overrides)).fit()
    assert np.isfinite(outputs.validation.loss)


# ------------------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["training.loss.name=combined"], r"'training.loss': name: combined needs at least one entry in terms"),
        (
            ["training.loss.name=combined", "training.loss.terms=[{name: combined}]"],
            r"'training.loss.terms.0.name' = 'combined': a term of a combined loss cannot be 'combined' itself",
        ),
        (
            ["training.loss.name=combined", "training.loss.terms=[{name: mse, weight: 0}, {name: mae, weight: 0}]"],
            r"'training.loss': terms: every weight is 0",
        ),
        (
            ["training.loss.name=combined", "training.loss.terms=[{name: mae, weight: -1}]"],
            r"'training.loss.terms.0.weight' = -1: expected at least 0",
        ),
        (["training.loss.terms=[{name: mae}]"], r"'training.loss': terms are read only with name: combined"),
        (
            ["training.loss.name=l1"],
            r"'training.loss.name' = 'l1': expected 'mse', 'mae', 'huber', 'combined', 'crps' or 'afcrps'",
        ),
        (["training.loss.huber_delta=0"], r"'training.loss.huber_delta' = 0"),
        (["training.scalers.pressure_level.kind=cubic"], r"'training.scalers.pressure_level.kind' = 'cubic'"),
        (["training.scalers.tendency.kind=var"], r"'training.scalers.tendency.kind' = 'var'"),
        (
            ["training.scalers.nodes.mask={latitude: [60, 30]}"],
            r"'training.scalers.nodes.mask.latitude' = \[60, 30\]: .*south <= north",
        ),
        (
            ["training.scalers.nodes.mask={longitude: [10, 10]}"],
            r"'training.scalers.nodes.mask.longitude' = \[10, 10\]: .*different",
        ),
        (
            ["training.scalers.nodes.mask={longitude: [350, -10]}"],
            r"'training.scalers.nodes.mask.longitude' = \[350, -10\]: .*different meridians",
        ),
        (["training.scalers.nodes.weights=cos"], r"'training.scalers.nodes.weights' = 'cos'"),
    ],
)
def test_config_errors_name_the_key(overrides, expected) -> None:
    message = config_error(*overrides)
    assert re.search(expected, message), message

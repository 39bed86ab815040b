"""Region-aware loss weights, validation and verification scores and the region map, on tiny real zarr stores with
point masks (``region``: the regional points of a combined grid; ``boundary``: the forced strip of a LAM grid)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import numpy as np
import pydantic
import pytest
import torch
import xarray as xr
from torch import nn

from anemo_like.config.loss_schema import NodeScaler
from anemo_like.data.point_masks import BOUNDARY, REGION, write_point_mask
from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr
from anemo_like.data.zarr_writer import write_anemoi_zarr
from anemo_like.diagnostics.plots import REGION_MAP, contiguous_longitudes
from anemo_like.inference.verification import JSON_SCORES, TABLE, VerificationRequest, verify_forecast
from anemo_like.models.rollout import ForecastSpec
from anemo_like.scoring.score_areas import REST, score_areas
from anemo_like.training.loss import WeightedLoss, WeightedMSE
from anemo_like.training.scalers import node_note, node_weights
from anemo_like.training.trainer import Trainer
from anemo_like.training.validation import Scoring, validate

VARIABLES = ["z_500", "t_850"]
NUM_REGION, NUM_REST, NUM_DATES = 30, 50, 8
START = np.datetime64("2020-01-01T00", "s")


def _grid(seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Latitudes, longitudes (degrees) and the region mask: 30 points in 35..70 N, 20 W..40 E (across 0 degrees),
    50 points elsewhere on the globe."""
    rng = np.random.default_rng(seed)
    lat_r, lon_r = rng.uniform(35, 70, NUM_REGION), np.mod(rng.uniform(-20, 40, NUM_REGION), 360.0)
    lat_o, lon_o = rng.uniform(-89, 30, NUM_REST), rng.uniform(0, 360, NUM_REST)
    region = np.r_[np.ones(NUM_REGION, bool), np.zeros(NUM_REST, bool)]
    return np.r_[lat_r, lat_o], np.r_[lon_r, lon_o], region


def _store(tmp_path: Path, *, masks: dict[str, np.ndarray], name: str = "data.zarr") -> AnemoiZarr:
    """A (8 dates, 2 variables, 1, 80 points) 6-hourly store with ``masks`` written beside its data."""
    lat, lon, _ = _grid()
    rng = np.random.default_rng(1)
    data = rng.normal(size=(NUM_DATES, len(VARIABLES), 1, lat.size)) * np.array([50.0, 2.0])[None, :, None, None]
    dates = START + np.arange(NUM_DATES) * np.timedelta64(6, "h")
    path = write_anemoi_zarr(
        tmp_path / name, data=data, variables=VARIABLES, dates=dates, latitudes=lat, longitudes=lon, frequency="6h"
    )
    for mask_name, mask in masks.items():
        write_point_mask(path, mask_name, mask)
    return open_anemoi_zarr(path)


def _region() -> np.ndarray:
    return _grid()[2]


def _boundary() -> np.ndarray:
    boundary = np.zeros(NUM_REGION + NUM_REST, bool)
    boundary[::7] = True
    return boundary


# ------------------------------------------------------------------------------------------------ loss weights
def test_region_weight_multiplies_the_regional_points_weight_in_the_loss(tmp_path) -> None:
    store = _store(tmp_path, masks={REGION: _region()})
    region = torch.as_tensor(_region())
    area = torch.rand(region.numel()) + 0.5
    uniform = node_weights(NodeScaler(weights="uniform", region_weight=3.0), area_weight=area, store=store)
    assert torch.equal(uniform, torch.where(region, 3.0, 1.0))
    weighted = node_weights(NodeScaler(region_weight=3.0), area_weight=area, store=store)
    torch.testing.assert_close(weighted, area * torch.where(region, 3.0, 1.0))
    # by hand: squared error 1 on the region, 0 elsewhere -> 3 * 30 / (3 * 30 + 50) of the points' weight
    prediction, target = region.float()[None, :, None].expand(2, -1, 1), torch.zeros(2, region.numel(), 1)
    loss = WeightedLoss(area_weight=uniform, variable_weight=torch.ones(1))
    assert float(loss(prediction, target)) == pytest.approx(90 / 140)
    plain = node_weights(NodeScaler(weights="uniform"), area_weight=area, store=store)
    assert float(WeightedLoss(area_weight=plain, variable_weight=torch.ones(1))(prediction, target)) == pytest.approx(
        30 / 80
    )
    assert "30 regional points x 3" in "; ".join(node_note(NodeScaler(region_weight=3.0), weighted, store))


def test_region_weight_without_a_region_mask_is_refused_naming_the_key_and_dataset(tmp_path) -> None:
    store = _store(tmp_path, masks={})
    with pytest.raises(ValueError) as info:
        node_weights(NodeScaler(region_weight=2.0), area_weight=torch.ones(80), store=store)
    message = str(info.value)
    assert "training.scalers.nodes.region_weight" in message and str(store.path) in message
    assert "no 'region' point mask" in message
    with pytest.raises(pydantic.ValidationError, match="greater than 0"):
        NodeScaler(region_weight=0.0)


def test_boundary_points_get_weight_zero_and_leave_the_loss_unchanged(tmp_path) -> None:
    boundary = _boundary()
    store = _store(tmp_path, masks={BOUNDARY: boundary})
    area = torch.rand(boundary.size) + 0.5
    weights = node_weights(NodeScaler(), area_weight=area, store=store)
    assert torch.equal(weights[torch.as_tensor(boundary)], torch.zeros(int(boundary.sum())))
    torch.testing.assert_close(weights[~torch.as_tensor(boundary)], area[~torch.as_tensor(boundary)])
    loss = WeightedLoss(area_weight=weights, variable_weight=torch.ones(1))
    target = torch.zeros(1, boundary.size, 1)
    interior_error = torch.rand(1, boundary.size, 1)
    boundary_error = interior_error + torch.as_tensor(boundary, dtype=torch.float32)[None, :, None] * 100
    assert float(loss(boundary_error, target)) == pytest.approx(float(loss(interior_error, target)))
    assert f"{int(boundary.sum())} boundary points (forced) weight 0" in node_note(NodeScaler(), weights, store)


# ------------------------------------------------------------------------------------------------- validation
class _FixedForecast(nn.Module):
    """Predicts the same normalised field (G, V) for every input."""

    def __init__(self, field: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("field", field)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.field.expand(x.shape[0], *self.field.shape)


def _validate(store: AnemoiZarr, area: torch.Tensor, field: torch.Tensor, scale: np.ndarray):
    """Validate ``field`` against 2 batches of 2 samples (1 input state, 2 leads) of ``store``; also the batches."""
    values = torch.as_tensor(store.read(slice(0, NUM_DATES), np.arange(2))).permute(0, 2, 1)  # (T, G, V)
    batches = [torch.stack([values[t : t + 3] for t in (i, i + 1)]) for i in (0, 2)]
    spec = ForecastSpec(multistep=1, input_positions=[0, 1], output_positions=[0, 1], num_prognostic=2)
    scoring = Scoring(
        output_names=VARIABLES,
        output_scale=scale,
        area_weight=area,
        step_length=datetime.timedelta(hours=6),
        loss_fn=WeightedMSE(area_weight=area, variable_weight=torch.ones(2)),
        areas=score_areas(store),
    )
    result = validate(_FixedForecast(field), batches, spec=spec, scoring=scoring, steps=2, device=torch.device("cpu"))
    return result, torch.cat(batches).double().numpy()


def _rmse(weight: np.ndarray, error: np.ndarray) -> np.ndarray:
    """(L, V) RMSE of error (B, L, G, V) with point weights (G,), by numpy."""
    w = weight / weight.sum()
    return np.sqrt(np.einsum("g,blgv->lv", w, error**2) / error.shape[0])


def test_validation_reports_region_and_rest_rmse_equal_to_numpy(tmp_path) -> None:
    region = _region()
    store = _store(tmp_path, masks={REGION: region})
    area, scale = torch.rand(region.size) + 0.5, np.array([9.81, 2.0])
    field = torch.randn(region.size, 2)
    result, batches = _validate(store, area, field, scale)
    model_error = (field.double().numpy()[None, None] - batches[:, 1:]) * scale
    persistence_error = (batches[:, :1] - batches[:, 1:]) * scale
    w = area.double().numpy()
    for name, points in ((REGION, region), (REST, ~region)):
        np.testing.assert_allclose(result.parts[name].model, _rmse(w * points, model_error), rtol=1e-6)
        np.testing.assert_allclose(result.parts[name].persistence, _rmse(w * points, persistence_error), rtol=1e-6)
    np.testing.assert_allclose(result.model_rmse, _rmse(w, model_error), rtol=1e-6)
    assert result.parts[REGION].model[0, 0] != pytest.approx(result.parts[REST].model[0, 0])
    record = result.as_record()
    assert record["rmse_region_z_500_6h"] == pytest.approx(result.parts[REGION].model[0, 0])
    assert record["rmse_rest_t_850_12h"] == pytest.approx(result.parts[REST].model[1, 1])
    table = result.table()
    assert "| region model RMSE | rest model RMSE |" in table
    assert f"| z_500 | 6h | {result.parts[REGION].model[0, 0]:.4g} | {result.parts[REST].model[0, 0]:.4g} |" in table


def test_validation_of_a_limited_area_dataset_scores_the_interior_only(tmp_path) -> None:
    boundary = _boundary()
    store = _store(tmp_path, masks={BOUNDARY: boundary})
    area, scale = torch.rand(boundary.size) + 0.5, np.array([1.0, 1.0])
    field = torch.randn(boundary.size, 2)
    result, batches = _validate(store, area, field, scale)
    error = field.double().numpy()[None, None] - batches[:, 1:]
    np.testing.assert_allclose(result.model_rmse, _rmse(area.double().numpy() * ~boundary, error), rtol=1e-6)
    assert not result.parts
    assert result.table().splitlines()[0].startswith(f"Interior points only: the {int(boundary.sum())} forced")


# ----------------------------------------------------------------------------------------------- verification
def _forecast(store: AnemoiZarr, noise: float) -> xr.Dataset:
    """Forecasts from dates 0 and 2 of ``store``, 2 steps of 6 h: the truth plus a fixed random error per point."""
    inits = store.dates[[0, 2]].astype("datetime64[ns]")
    steps = np.array([6, 12], "timedelta64[h]").astype("timedelta64[ns]")
    rng = np.random.default_rng(5)
    fields = {}
    for v, name in enumerate(VARIABLES):
        truth = np.stack([store.read(slice(i + 1, i + 3), np.array([v]))[:, 0] for i in (0, 2)])  # (2, 2, G)
        fields[name] = (("time", "step", "values"), truth + noise * rng.normal(size=truth.shape[-1]))
    coords = {
        "time": inits,
        "step": steps,
        "valid_time": (("time", "step"), inits[:, None] + steps[None]),
        "latitude": ("values", store.latitudes),
        "longitude": ("values", store.longitudes),
    }
    return xr.Dataset(fields, coords=coords)


def _request(tmp_path: Path, store: AnemoiZarr, area: np.ndarray) -> VerificationRequest:
    return VerificationRequest(
        forecast=tmp_path / "forecast.nc", store=store, initial=store, variables=VARIABLES, num_prognostic=2,
        area_weight=area, climatology=None, output=tmp_path / "verification", plot_variable="z_500", plot_lead=None,
    )  # fmt: skip


def test_verification_has_region_and_rest_columns_and_writes_the_region_map(tmp_path) -> None:
    region = _region()
    store = _store(tmp_path, masks={REGION: region})
    area = np.random.default_rng(3).uniform(0.5, 1.5, region.size)
    forecast = _forecast(store, noise=4.0)
    result = verify_forecast(_request(tmp_path, store, area), forecast)
    truth = np.stack([store.read(slice(i + 1, i + 3), np.arange(2)) for i in (0, 2)]).transpose(0, 1, 3, 2)
    error = np.stack([forecast[name].values for name in VARIABLES], axis=-1) - truth  # (N, L, G, V)
    for name, points in ((REGION, region), (REST, ~region)):
        np.testing.assert_allclose(result.parts[name].rmse["model"], _rmse(area * points, error), rtol=1e-5)
    np.testing.assert_allclose(result.rmse["model"], _rmse(area, error), rtol=1e-5)
    table = (tmp_path / "verification" / TABLE).read_text()
    assert "| variable | lead | region RMSE | rest RMSE | region MAE | rest MAE |" in table
    document = json.loads((tmp_path / "verification" / JSON_SCORES).read_text())
    assert set(document["parts"]) == {REGION, REST}
    assert document["parts"][REGION]["z_500"]["6h"]["rmse"] == pytest.approx(result.parts[REGION].rmse["model"][0, 0])
    assert "points" not in document
    assert (tmp_path / "verification" / REGION_MAP).stat().st_size > 0


def test_verification_of_a_limited_area_truth_scores_the_interior_only(tmp_path) -> None:
    boundary = _boundary()
    store = _store(tmp_path, masks={BOUNDARY: boundary})
    area = np.ones(boundary.size)
    forecast = _forecast(store, noise=4.0)
    result = verify_forecast(_request(tmp_path, store, area), forecast)
    truth = np.stack([store.read(slice(i + 1, i + 3), np.arange(2)) for i in (0, 2)]).transpose(0, 1, 3, 2)
    error = np.stack([forecast[name].values for name in VARIABLES], axis=-1) - truth
    np.testing.assert_allclose(result.rmse["model"], _rmse(area * ~boundary, error), rtol=1e-5)
    table = (tmp_path / "verification" / TABLE).read_text()
    assert "Interior points only" in table and "region RMSE" not in table
    assert "Interior points only" in json.loads((tmp_path / "verification" / JSON_SCORES).read_text())["points"]
    assert not (tmp_path / "verification" / REGION_MAP).exists()


def test_region_longitudes_are_made_continuous_across_zero() -> None:
    np.testing.assert_allclose(contiguous_longitudes(np.array([340.0, 359.0, 0.0, 40.0])), [-20, -1, 0, 40])
    np.testing.assert_allclose(contiguous_longitudes(np.array([170.0, 190.0])), [170, 190])


# ------------------------------------------------------------------------------------------------ a training run
def test_training_on_a_combined_dataset_weighs_and_scores_the_region(tmp_path, compose_run, caplog) -> None:
    rng = np.random.default_rng(0)
    lat, lon = np.degrees(np.arcsin(rng.uniform(-1, 1, 200))), rng.uniform(0, 360, 200)
    region = (lat > 35) & (lat < 70) & ((lon < 40) | (lon > 340))
    data = rng.normal(size=(40, 2, 1, 200)).cumsum(0) * np.array([50.0, 2.0])[None, :, None, None]
    dates = START + np.arange(40) * np.timedelta64(6, "h")
    path = write_anemoi_zarr(
        tmp_path / "combined.zarr", data=data, variables=VARIABLES, dates=dates, latitudes=lat, longitudes=lon,
        frequency="6h",
    )  # fmt: skip
    write_point_mask(path, REGION, region)
    config = compose_run(
        tmp_path / "run",
        [
            f"data.dataset={path}", "data.variables.prognostic=[z_500,t_850]", "data.variables.forcing=[]",
            "~data.normalizer.per_variable", "data.splits.train.end=2020-01-07T18:00:00",
            "data.splits.val.start=2020-01-08T00:00:00", "training.max_steps=2", "training.val_every_n_steps=2",
            "training.checkpoint_every_n_steps=2", "training.val_rollout=2", "training.val_climatology_dates=5",
            "training.scalers.nodes.region_weight=4", "dataloader.batch_size.val=4",
        ],
    )  # fmt: skip
    with caplog.at_level("INFO", logger="anemo_like.training.scalers"):
        outputs = Trainer(config).fit()
    assert f"{int(region.sum())} regional points x 4" in caplog.text
    table = (outputs.run_dir / "validation.md").read_text()
    assert "| variable | lead | region model RMSE | rest model RMSE |" in table
    record = json.loads(outputs.metrics.read_text().splitlines()[-1])
    assert record["rmse_region_z_500_6h"] == pytest.approx(outputs.validation.parts[REGION].model[0, 0])
    assert (outputs.run_dir / REGION_MAP).stat().st_size > 0

"""The built-in synthetic dataset: format, determinism, size and time limits, and learnable dynamics."""

from __future__ import annotations

import datetime
import importlib.util
import time
from pathlib import Path

import numpy as np
import pytest

from anemo_like.data import builtin
from anemo_like.data.builtin import BUILTIN_NAME, PROGNOSTIC, VARIABLES, ensure_builtin_dataset, simulate
from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr

BASELINES_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "builtin_baselines.py"


def load_baselines():
    """The benchmark script as a module (it holds the area-weighted RMSE and the local regression)."""
    spec = importlib.util.spec_from_file_location("builtin_baselines", BASELINES_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> tuple[Path, float]:
    cache = tmp_path_factory.mktemp("builtin-cache")
    start = time.perf_counter()
    path = ensure_builtin_dataset(cache, seed=0)
    return path, time.perf_counter() - start


@pytest.fixture(scope="module")
def store(generated) -> AnemoiZarr:
    return open_anemoi_zarr(generated[0])


@pytest.fixture(scope="module")
def prognostic(store) -> np.ndarray:
    """(dates, prognostic variables, grid) float64."""
    return store.read(slice(None), store.variable_indices(PROGNOSTIC)).astype(np.float64)


def test_generation_is_fast_and_small(generated) -> None:
    path, seconds = generated
    assert path.name == f"{BUILTIN_NAME}-seed0.zarr"
    size_mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
    assert seconds < 30, f"generation took {seconds:.1f} s"
    assert 5 < size_mb < 50, f"store is {size_mb:.1f} MB"


def test_existing_dataset_is_reused(generated) -> None:
    path, _ = generated
    before = (path / "data" / ".zarray").stat().st_mtime_ns
    start = time.perf_counter()
    assert ensure_builtin_dataset(path.parent, seed=0) == path
    assert time.perf_counter() - start < 1
    assert (path / "data" / ".zarray").stat().st_mtime_ns == before


def test_format_matches_the_real_datasets(store) -> None:
    assert store.zarr_format == 2
    assert store.variables == list(VARIABLES)
    assert store.shape == (1460, 11, 1, 32 * 64)
    assert store.frequency == datetime.timedelta(hours=6)
    assert store.dates[0] == np.datetime64("2000-01-01T00:00:00")
    assert store.dates[-1] == np.datetime64("2000-12-30T18:00:00")
    assert store.attrs["constant_fields"] == ["cos_latitude", "cos_longitude", "sin_latitude", "sin_longitude"]
    assert "quasi-geostrophic" in store.attrs["description"]
    lat, lon = store.latitudes, store.longitudes
    assert lat[0] == pytest.approx(87.1875) and lat[-1] == pytest.approx(-87.1875)
    assert lon.min() == 0 and lon.max() == pytest.approx(354.375)
    forcings = store.read(slice(0, 2), store.variable_indices(["cos_latitude", "sin_longitude"]))
    np.testing.assert_allclose(forcings[1, 0], np.cos(np.deg2rad(lat)), atol=1e-6)
    np.testing.assert_allclose(forcings[0, 1], np.sin(np.deg2rad(lon)), atol=1e-6)


def test_values_look_physical(store, prognostic) -> None:
    mean = dict(zip(PROGNOSTIC, prognostic.mean(axis=(0, 2)), strict=True))
    assert 9.8e4 < mean["sp"] < 1.02e5
    assert 260 < mean["t_850"] < 285
    assert 5.0e4 < mean["z_500"] < 5.8e4
    assert abs(mean["v_250"]) < 0.5 and abs(mean["v_850"]) < 0.5
    assert 5 < mean["u_250"] < 30
    assert np.abs(prognostic[:, PROGNOSTIC.index("u_250")]).max() < 150
    index = store.variable_indices(PROGNOSTIC)
    np.testing.assert_allclose(store.statistics["mean"][index], prognostic.mean(axis=(0, 2)), rtol=1e-6)


def test_same_seed_same_fields_other_seed_other_fields() -> None:
    first = simulate(seed=3, n_dates=6, spin_up_days=3)
    assert first.shape == (6, len(PROGNOSTIC), 32 * 64) and first.dtype == np.float32
    np.testing.assert_array_equal(simulate(seed=3, n_dates=6, spin_up_days=3), first)
    other = simulate(seed=4, n_dates=6, spin_up_days=3)
    assert not np.allclose(other, first)


def test_mantissa_rounding_is_small_and_to_nearest() -> None:
    values = np.array([1.0, 287.123, -12.3456, 101325.7, 0.0], dtype=np.float32)
    rounded = builtin.round_mantissa(values, bits=14)
    np.testing.assert_allclose(rounded, values, rtol=2.0**-15)
    assert np.all(rounded.view(np.uint32) & np.uint32((1 << 9) - 1) == 0)


def test_persistence_is_clearly_better_than_climatology(store, prognostic) -> None:
    baselines = load_baselines()
    weights = baselines.area_weights(store.latitudes)
    persistence = baselines.rmse(prognostic[1:] - prognostic[:-1], weights)
    climatology = baselines.rmse(prognostic - prognostic.mean(axis=0), weights)
    ratio = dict(zip(PROGNOSTIC, persistence / climatology, strict=True))
    assert all(0.15 < r < 0.7 for r in ratio.values()), ratio


def test_a_local_linear_model_beats_persistence_clearly(store, prognostic) -> None:
    """Ridge regression on 3 x 3 neighbourhoods of the last two states, fitted on 150 dates, scored on the next 75."""
    baselines = load_baselines()
    train, test = 150, 75
    values = prognostic[-(train + test) :]
    predicted = baselines.local_regression(values.reshape(len(values), len(PROGNOSTIC), 32, 64), lead=1, split=train)
    weights = baselines.area_weights(store.latitudes)
    regression = baselines.rmse(predicted.reshape(test, len(PROGNOSTIC), -1) - values[train:], weights)
    persistence = baselines.rmse(values[train:] - values[train - 1 : -1], weights)
    ratio = dict(zip(PROGNOSTIC, regression / persistence, strict=True))
    assert all(r < 0.6 for r in ratio.values()), ratio

"""The built-in synthetic dataset: format, determinism, size, and learnable dynamics."""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from anemo_like.data import builtin, quasi_geostrophic
from anemo_like.data.builtin import BUILTIN_NAME, PROGNOSTIC, VARIABLES, ensure_builtin_dataset, simulate
from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr

BASELINES_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "skill" / "builtin_baselines.py"


def load_baselines():
    """The benchmark script as a module (it holds the area-weighted RMSE and the local regression)."""
    spec = importlib.util.spec_from_file_location("builtin_baselines", BASELINES_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    cache = tmp_path_factory.mktemp("builtin-cache")
    return ensure_builtin_dataset(cache, seed=0)


@pytest.fixture(scope="module")
def store(generated) -> AnemoiZarr:
    return open_anemoi_zarr(generated)


@pytest.fixture(scope="module")
def prognostic(store) -> np.ndarray:
    """(dates, prognostic variables, grid) float64."""
    return store.read(slice(None), store.variable_indices(PROGNOSTIC)).astype(np.float64)


def test_generation_is_small(generated) -> None:
    path = generated
    assert path.name == f"{BUILTIN_NAME}-seed0.zarr"
    size_mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6
    assert 5 < size_mb < 50, f"store is {size_mb:.1f} MB"


def test_existing_dataset_is_reused(generated) -> None:
    path = generated
    before = (path / "data" / ".zarray").stat().st_mtime_ns
    assert ensure_builtin_dataset(path.parent, seed=0) == path
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


# (mean, std, min, max) bounds per variable: what a 2-layer QG atmosphere with these constants can produce, far from the
# ~1e12 Pa sp and m²/s² z_500 a zonal-mean Laplacian inverse that kept its null mode produced with numpy 2.5.2
PHYSICAL = {
    "sp": ((9.8e4, 1.02e5), (500, 6000), (8.0e4, 1.0e5), (1.0e5, 1.2e5)),
    "t_850": ((255, 280), (10, 40), (180, 260), (270, 320)),
    "u_250": ((5, 40), (5, 40), (-100, 0), (40, 150)),
    "u_850": ((-5, 10), (2, 20), (-100, 0), (10, 100)),
    "v_250": ((-0.5, 0.5), (2, 30), (-150, -10), (10, 150)),
    "v_850": ((-0.5, 0.5), (1, 20), (-100, -5), (5, 100)),
    "z_500": ((5.0e4, 5.8e4), (2000, 15000), (2.5e4, 5.0e4), (5.5e4, 7.5e4)),
}


def test_every_variable_lies_in_its_physical_range(prognostic) -> None:
    stats = {"mean": prognostic.mean(axis=(0, 2)), "std": prognostic.std(axis=(0, 2))}
    stats.update(min=prognostic.min(axis=(0, 2)), max=prognostic.max(axis=(0, 2)))
    wrong = [
        f"{name} {stat} {stats[stat][i]:.4g} not in {bounds}"
        for i, name in enumerate(PROGNOSTIC)
        for stat, bounds in zip(("mean", "std", "min", "max"), PHYSICAL[name], strict=True)
        if not bounds[0] < stats[stat][i] < bounds[1]
    ]
    assert not wrong, wrong


class _AdversarialSphere(quasi_geostrophic._Sphere):
    """A sphere whose zonal-mean Laplacian has the smallest singular value ``noise`` x the largest instead of the
    ~1e-17 that rounding gives here: another numpy/libm/LAPACK may put it above np.linalg.pinv's 1e-15 cutoff."""

    noise = 2e-15

    def _laplacian(self) -> np.ndarray:
        lap = super()._laplacian()
        u, singular, vt = np.linalg.svd(lap[0])
        singular[-1] = self.noise * singular[0]
        lap[0] = (u * singular) @ vt
        return lap


@pytest.mark.parametrize("noise", [0.0, 1e-17, 2e-15, 1e-13])
def test_the_zonal_mean_inverse_laplacian_drops_the_null_mode_whatever_rounding_made_of_it(noise) -> None:
    reference = quasi_geostrophic._Sphere()
    sphere = type("Sphere", (_AdversarialSphere,), {"noise": noise})()
    inverse = quasi_geostrophic.inverse_laplacian(sphere.lap)
    scale = np.abs(reference.inv_lap[0]).max()
    np.testing.assert_allclose(inverse[0], reference.inv_lap[0], rtol=0, atol=1e-9 * scale)
    np.testing.assert_array_equal(inverse[1:], reference.inv_lap[1:])
    # no output along the constants (the null mode): it would be 1 / noise ~ 1e25 times larger than the rest
    np.testing.assert_allclose(np.ones(quasi_geostrophic.N_LAT) @ inverse[0], 0.0, atol=1e-9 * scale)
    np.testing.assert_allclose(sphere.balance[0], reference.balance[0], rtol=0, atol=1e-9)


def test_the_zonal_mean_inverse_is_bit_identical_to_numpy_pinv_where_pinv_drops_the_null_mode() -> None:
    """The generator's values (and every number documented from them) are unchanged where pinv worked."""
    lap = quasi_geostrophic._Sphere().lap
    singular = np.linalg.svd(lap[0], compute_uv=False)
    assert singular[-1] < 1e-15 * singular[0]  # here pinv's default cutoff dropped the null mode
    np.testing.assert_array_equal(quasi_geostrophic.inverse_laplacian(lap)[0], np.linalg.pinv(lap[0]))


def test_balanced_variables_stay_physical_with_an_adversarial_laplacian() -> None:
    """Two days of the model whose zonal-mean Laplacian's null mode sits above pinv's cutoff: with np.linalg.pinv
    sp and z_500 reached ~1e9 (~1e12 after a year); now they match the ordinary sphere's."""
    results = []
    for sphere in (quasi_geostrophic._Sphere(), _AdversarialSphere()):
        model = quasi_geostrophic._TwoLayerModel(sphere)
        previous = current = model.initial_state(np.random.default_rng(0))
        for _ in range(16):
            previous, current = model.step(previous, current)
        results.append(model.variables(current))
    quasi_geostrophic.check_physical(results[1], what="adversarial sphere")
    np.testing.assert_allclose(results[1].std(axis=-1), results[0].std(axis=-1), rtol=1e-3)
    np.testing.assert_allclose(results[1].mean(axis=-1), results[0].mean(axis=-1), rtol=1e-6, atol=1e-6)


def test_unphysical_values_are_refused() -> None:
    values = np.zeros((2, len(PROGNOSTIC), 8))
    values[:, PROGNOSTIC.index("sp")] = 1e5
    values[:, PROGNOSTIC.index("t_850")] = 270
    values[:, PROGNOSTIC.index("z_500")] = 5.5e4
    quasi_geostrophic.check_physical(values, what="test")
    values[1, PROGNOSTIC.index("z_500"), 3] = 1.2e12
    with pytest.raises(RuntimeError, match=r"test is unphysical: z_500 spans \[5\.5e\+04, 1\.2e\+12\]"):
        quasi_geostrophic.check_physical(values, what="test")
    values[0, PROGNOSTIC.index("sp"), 0] = np.nan
    with pytest.raises(RuntimeError, match="sp is not finite; z_500 spans"):
        quasi_geostrophic.check_physical(values, what="test")


def test_an_unphysical_cached_dataset_is_generated_again(tmp_path, monkeypatch) -> None:
    """A store left by the unstable generator is replaced rather than reused (simulate faked to keep this fast)."""
    physical = {"sp": 1.0e5, "t_850": 270.0, "z_500": 5.5e4}
    fields = np.array([physical.get(name, 1.0) for name in PROGNOSTIC], dtype=np.float32)
    good = np.broadcast_to(fields[None, :, None], (builtin.N_DATES, len(PROGNOSTIC), 32 * 64)).copy()
    bad = good.copy()
    bad[7, PROGNOSTIC.index("sp"), 5] = 1.4e13
    monkeypatch.setattr(builtin, "simulate", lambda seed, progress: bad)
    path = builtin.write_builtin_dataset(tmp_path / f"{BUILTIN_NAME}-seed0.zarr", seed=0)
    assert open_anemoi_zarr(path).statistics["maximum"][VARIABLES.index("sp")] > 1e13
    monkeypatch.setattr(builtin, "simulate", lambda seed, progress: good)
    assert ensure_builtin_dataset(tmp_path, seed=0) == path
    assert open_anemoi_zarr(path).statistics["maximum"][VARIABLES.index("sp")] == pytest.approx(1e5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # the old store is gone, nothing left aside
    before = (path / "data" / ".zarray").stat().st_mtime_ns
    assert ensure_builtin_dataset(tmp_path, seed=0) == path  # a physical store is reused
    assert (path / "data" / ".zarray").stat().st_mtime_ns == before


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

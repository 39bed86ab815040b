"""A limited-area model end to end: trained on a box whose boundary strip is forced by a global dataset, it
forecasts with the boundary taken from its dataset or from a global forecast file. The boundary values written are
the forced ones exactly, and the interior depends on them; a global forecast in other units drives the same
boundary; what a limited-area forecast cannot use is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from bad_input_helpers import TINY_DATA
from conftest import TINY_MODEL
from hydra import compose, initialize_config_dir
from inference_helpers import documented, infer_config, setup_error
from omegaconf import OmegaConf
from regional_helpers import box_grid, global_grid, write_store

from anemo_like.config import config_dir, validate_config
from anemo_like.data.boundary import open_boundary
from anemo_like.data.interpolation import spherical_interpolator
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.run import run_inference
from anemo_like.training.trainer import Trainer

PROGNOSTIC = ["sp", "t_850", "z_500"]
INIT = np.datetime64("2000-01-04T00", "s")
LEADS = 2  # 6 h steps


@pytest.fixture(scope="module")
def lam(tmp_path_factory, cache_dir) -> dict[str, Path]:
    """Stores (box, globe) and a limited-area checkpoint trained for 2 steps on them (1-row boundary strip)."""
    root = tmp_path_factory.mktemp("lam")
    box = write_store(root / "box.zarr", *box_grid(), seed=1)
    globe = write_store(root / "globe.zarr", *global_grid(), seed=2, noise=0.0)
    overrides = [
        *TINY_MODEL, *TINY_DATA, f"system.paths.output={root / 'run'}", f"system.paths.cache={cache_dir}",
        f"data.dataset={box}", f"data.boundary={{dataset:{globe},width_km:null,width_rows:1}}",
        "graph.hidden={kind:limited_area,region_resolution:4,margin_km:300}",
    ]  # fmt: skip
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        config = validate_config(OmegaConf.to_container(compose("quickstart", overrides=overrides), resolve=True))
    outputs = Trainer(config).fit()
    return {"box": box, "globe": globe, "checkpoint": outputs.run_dir / "inference.pt", "root": root}


def forecast(lam: dict[str, Path], name: str, *overrides: str) -> xr.Dataset:
    output = lam["root"] / f"{name}.nc"
    config = infer_config(lam["checkpoint"], f"dates=[{INIT}]", "lead_time=12h", f"output={output}", *overrides)
    run_inference(config)
    return xr.load_dataset(output)


def global_forecast(lam: dict[str, Path], path: Path) -> xr.Dataset:
    """A forecast file as anemo-infer writes it for a global model: (time, step, values), 12 h from INIT."""
    lat, lon = global_grid()
    rng = np.random.default_rng(5)
    fields = {
        name: (("time", "step", "values"), rng.normal(size=(1, LEADS, lat.size)).astype(np.float32))
        for name in PROGNOSTIC
    }
    coords = {
        "time": [INIT.astype("datetime64[ns]")],
        "step": (np.arange(1, LEADS + 1) * np.timedelta64(6, "h")).astype("timedelta64[ns]"),
        "latitude": ("values", lat),
        "longitude": ("values", lon),
    }
    xr.Dataset(fields, coords=coords).to_netcdf(path)
    return xr.load_dataset(path)


def test_boundary_values_are_the_forced_ones_exactly_and_drive_the_interior(lam) -> None:
    view = open_boundary(open_anemoi_zarr(lam["box"]), open_anemoi_zarr(lam["globe"]), width_km=None, width_rows=1)
    forced = view.point_masks["boundary"]
    assert 0 < forced.sum() < forced.size
    truth = forecast(lam, "truth")
    rows = np.searchsorted(view.dates, INIT) + np.arange(1, LEADS + 1)
    variables = view.variable_indices(PROGNOSTIC)
    expected = view.read(slice(rows[0], rows[-1] + 1), variables)  # (L, V, G): the global data interpolated
    for v, name in enumerate(PROGNOSTIC):
        np.testing.assert_array_equal(truth[name].values[0][:, forced], expected[:, v, forced])

    driver = global_forecast(lam, lam["root"] / "global.nc")
    driven = forecast(lam, "driven", f"boundary={lam['root'] / 'global.nc'}")
    box = open_anemoi_zarr(lam["box"])
    to_boundary = spherical_interpolator(
        driver["latitude"].values, driver["longitude"].values, box.latitudes[forced], box.longitudes[forced]
    )
    for name in PROGNOSTIC:
        wanted = to_boundary.apply(driver[name].values[0]).astype(np.float32)  # (L, forced points)
        np.testing.assert_array_equal(driven[name].values[0][:, forced], wanted)
        for k in range(2):  # each step reads the boundary of the state it predicts; the second is also fed one
            assert np.abs(driven[name].values[0][k, ~forced] - truth[name].values[0][k, ~forced]).max() > 1e-6

    other_units = driver.copy(deep=True)  # a global model trained in °C, gpm and hPa drives the same boundary
    for name, (unit, scale, offset) in {"t_850": ("degC", 1.0, -273.15), "z_500": ("gpm", 1 / 9.80665, 0.0),
                                        "sp": ("hPa", 0.01, 0.0)}.items():  # fmt: skip
        other_units[name].values = driver[name].values.astype(np.float64) * scale + offset
        other_units[name].attrs["units"] = unit
    other_units.to_netcdf(lam["root"] / "other_units.nc")
    again = forecast(lam, "again", f"boundary={lam['root'] / 'other_units.nc'}")
    for name in PROGNOSTIC:
        np.testing.assert_allclose(again[name].values[0][:, forced], driven[name].values[0][:, forced], atol=1e-4)


def test_a_boundary_file_that_does_not_fit_is_refused(lam) -> None:
    """Checked at set-up, before any forecast runs, each with its row in docs/errors.md."""
    root = lam["root"]
    driver = global_forecast(lam, root / "global.nc")
    driver.isel(step=[0]).to_netcdf(root / "one_step.nc")
    nan = driver.copy(deep=True)
    nan["t_850"].values[0, 1, :3] = np.nan
    nan.to_netcdf(root / "nan.nc")
    (root / "global.grib").write_bytes(b"GRIB")
    driver.drop_vars("z_500").to_netcdf(root / "lacks.nc")
    driver.expand_dims(number=2).transpose("time", "number", ...).to_netcdf(root / "members.nc")
    driver.isel(values=np.flatnonzero(driver["latitude"].values > 40.0)).to_netcdf(root / "north.nc")
    driver["t_850"].attrs["units"] = "furlong"
    driver.to_netcdf(root / "furlong.nc")
    forecast(lam, "own")  # the model's own regional forecast
    config = infer_config(lam["checkpoint"], f"dates=[{INIT}]", "lead_time=12h", f"output={root / 'x.nc'}")
    cases = {
        "one_step.nc": "its forecast from 2000-01-04T00:00:00 reaches 6h, this forecast needs every step to 12h "
        "(missing 12h); run the global model as far",
        "nan.nc": "t_850 holds NaN or inf in its forecast from 2000-01-04T00:00:00 at step 12h; drive the boundary "
        "with a complete forecast",
        "global.grib": "a GRIB file; give a global model's forecast written by anemo-infer as netCDF or zarr "
        "(output=FILE.nc)",
        "own.nc": "a forecast on this model's own grid (its 121 points), not a global one: the boundary must come "
        "from a forecast of a global model that covers the region",
        "lacks.nc": "lacks the variable(s) z_500; it must hold sp, t_850, z_500 on (time, step, values) with "
        "latitude and longitude, as anemo-infer writes a global model's forecast",
        "members.nc": "an ensemble forecast (2 members); drive the boundary with a deterministic forecast (or one "
        "member written on its own)",
        "north.nc": "its grid does not cover the boundary points: cannot interpolate to 40 target point(s), e.g. "
        "(-10, 0): no triangle of the 72 source points contains it; give a forecast of a global model (or of one "
        "whose grid covers the region)",
        "furlong.nc": "t_850 is in 'furlong' (a unit anemo-infer does not know) and the model reads it in 'K': "
        "convert it to K, or correct its units attribute",
    }
    for name, expected in cases.items():
        message = setup_error(config.model_copy(update={"boundary": str(root / name)}))
        assert message == f"boundary {root / name}: {expected}", message
        documented(message, FILE=root / name)
    dataset = setup_error(config.model_copy(update={"boundary": str(lam["globe"])}))
    assert dataset.startswith(f"boundary {lam['globe']}: an anemoi dataset, not a forecast")
    documented(dataset, FILE=lam["globe"])
    later = setup_error(config.model_copy(update={"dates": ["2000-01-04T06"], "boundary": str(root / "global.nc")}))
    assert later.startswith(f"boundary {root / 'global.nc'}: no forecast from 2000-01-04T06:00:00")
    assert not (root / "x.nc").exists()
    missing = config.model_copy(update={"boundary": str(root / "absent.nc")})
    assert "no such file" in setup_error(missing)
    elsewhere = config.model_copy(update={"dataset": str(lam["box"])})
    assert "is a limited-area model, which starts from its own dataset" in setup_error(elsewhere)

"""anemo-infer output=forecast.grib (docs/inference.md, "Operational formats"): GRIB2 read back with ecCodes (every
key, values within the packing precision, ecCodes' own coordinates) and with xarray + cfgrib, on the built-in's
regular lat/lon grid (a run of the session's ``skilled`` model, verified), an O48 reduced Gaussian grid (the
writer) and an unstructured grid (an ensemble run of a tiny model, with its coordinates file); the grid classifier.
NaN (an imputed variable's missing points) written as missing and read back as NaN; a full disk; the coordinates
file replaces only its own; the other refusals are in test_grib_refusals.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import eccodes
import numpy as np
import pytest
import torch
import xarray as xr
import yaml
from bad_input_helpers import TINY_DATA, tiny_dataset, tiny_grid
from inference_helpers import documented, infer_config, setup_error
from test_ensemble_inference import ENSEMBLE, FAST
from test_full_disk import on_small_disk, tmpfs_available

from anemo_like.config.inference import GribConfig, MarsKeys, inference_config_dir
from anemo_like.data.grid_kinds import classify_grid
from anemo_like.data.grids import gaussian_latitudes, octahedral_grid, regular_grid
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.grib_output import grib_plan, write_grib
from anemo_like.inference.grib_reader import read_grib
from anemo_like.inference.output import forecast_dataset, open_forecast
from anemo_like.inference.run import run_inference
from anemo_like.training.trainer import Trainer

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
TABLE = yaml.safe_load((inference_config_dir() / "quickstart.yaml").read_text())["grib"]["variables"]
KEYS = {name: MarsKeys(**keys) for name, keys in TABLE.items()}
GRIB_TABLE = [f"+grib.variables.{name}={{{', '.join(f'{k}: {v}' for k, v in keys.items())}}}" for name, keys in
              TABLE.items()]  # fmt: skip
LEVEL = {"sfc": ("surface", 0), "pl": ("isobaricInhPa", None)}
CFGRIB = {"engine": "cfgrib", "backend_kwargs": {"indexpath": ""}}


def messages(path: Path) -> list[dict]:
    """Every message of a GRIB file: its keys (those anemo-infer sets) and values (G,) float64."""
    names = ["shortName", "paramId", "typeOfLevel", "level", "dataDate", "dataTime", "step", "stepUnits", "type",
             "stream", "class", "expver", "gridType", "packingType", "bitsPerValue", "generatingProcessIdentifier",
             "backgroundProcess", "number", "numberOfForecastsInEnsemble", "edition"]  # fmt: skip
    found = []
    with open(path, "rb") as file:
        while (handle := eccodes.codes_grib_new_from_file(file)) is not None:
            keys = {k: eccodes.codes_get(handle, k) for k in names if eccodes.codes_is_defined(handle, k)}
            keys["step"] = eccodes.codes_get_long(handle, "step")  # a string of em and es (template 4.2)
            keys["values"] = eccodes.codes_get_values(handle)
            for name in ("latitudes", "longitudes"):  # ecCodes' own, not of an unstructured grid
                structured = keys["gridType"] != "unstructured_grid"
                keys[name] = eccodes.codes_get_array(handle, name) if structured else None
            found.append(keys)
            eccodes.codes_release(handle)
    return found


def check_message(message: dict, expected: np.ndarray, keys: MarsKeys, *, date: np.datetime64, hours: int,
                  expver: str = "0001") -> None:  # fmt: skip
    """The keys every message carries, and its values within (max - min) / 2**16 of ``expected`` (G,)."""
    when = date.astype("datetime64[m]").item()
    assert message["paramId"] == eccodes.codes_get(handle_of(keys), "paramId")
    level_type, level = LEVEL[keys.levtype]
    assert (message["typeOfLevel"], message["level"]) == (level_type, keys.levelist if level is None else level)
    assert message["dataDate"] == when.year * 10000 + when.month * 100 + when.day
    assert message["dataTime"] == when.hour * 100 + when.minute
    assert (message["step"], message["stepUnits"]) == (hours, 1)  # stepUnits 1: hours
    assert message["class"] == "ml" and message["expver"] == expver and message["edition"] == 2
    assert (message["packingType"], message["bitsPerValue"]) == ("grid_simple", 16)
    assert (message["backgroundProcess"], message["generatingProcessIdentifier"]) == (97, 105)  # the marker
    span = float(expected.max() - expected.min())
    assert np.abs(message["values"] - expected).max() <= span / 2**16 + 1e-6 * abs(expected).max()


def handle_of(keys: MarsKeys) -> int:
    """A GRIB2 handle with the shortName of ``keys`` (for its paramId)."""
    handle = eccodes.codes_grib_new_from_samples("GRIB2")
    eccodes.codes_set_string(handle, "shortName", keys.param)
    return handle


def check_coordinates(message: dict, latitudes: np.ndarray, longitudes: np.ndarray) -> None:
    """ecCodes' own coordinates of a message are ours, to 1e-6 degrees."""
    np.testing.assert_allclose(message["latitudes"], latitudes, rtol=0, atol=1e-6)
    np.testing.assert_allclose(message["longitudes"], longitudes, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ the grids
def test_classifier_finds_each_kind_of_grid() -> None:
    o48, builtin = octahedral_grid(48), regular_grid(32, 64)
    gaussian, _ = gaussian_latitudes(16)
    classic_rows = np.array([*range(8, 40, 2), *range(38, 6, -2)])  # a classic reduced N16
    classic = (np.repeat(gaussian, classic_rows), np.concatenate([np.arange(n) * 360.0 / n for n in classic_rows]))
    poles = (np.repeat(np.linspace(90, -90, 19), 36), np.tile(np.arange(36) * 10.0, 19))
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(o48.size)
    kinds = {
        "regular_ll": [(builtin.latitudes, builtin.longitudes), poles],
        "regular_gg": [(np.repeat(gaussian, 64), np.tile(np.arange(64) * 5.625, 32))],
        "reduced_gg": [(o48.latitudes, o48.longitudes), classic],
        "unstructured": [
            (rng.uniform(-90, 90, 500), rng.uniform(0, 360, 500)),
            tiny_grid(),  # rows south to north
            (o48.latitudes[shuffled], o48.longitudes[shuffled]),
            (builtin.latitudes, builtin.longitudes + 1.0),  # rows not from 0 east
        ],
    }
    for name, grids in kinds.items():
        for latitudes, longitudes in grids:
            assert classify_grid(latitudes, longitudes).name == name
    o48_kind = classify_grid(o48.latitudes.astype(np.float32), o48.longitudes.astype(np.float32))
    assert o48_kind.name == "reduced_gg" and o48_kind.gaussian_number == 48
    np.testing.assert_array_equal(o48_kind.row_sizes[:3], [20, 24, 28])
    assert classify_grid(*classic).gaussian_number == 16


def synthetic_forecast(store, steps: int) -> xr.Dataset:
    """The Dataset anemo-infer writes of one forecast from the dataset's first date, its next ``steps`` dates as
    the leads (physical values, float32)."""
    names = list(KEYS)
    fields = store.read(slice(1, steps + 1), store.variable_indices(names))  # (L, V, G)
    inputs = SimpleNamespace(
        store=store, roles=SimpleNamespace(output=names, prognostic=names), init_dates=store.dates[:1],
        steps=steps, step=store.frequency,
    )  # fmt: skip
    forecasts = fields.transpose(0, 2, 1)[None, None].astype(np.float32)  # (1, 1, L, G, V)
    return forecast_dataset(forecasts, inputs, checkpoint=Path("none.pt"), precision="fp32")


def test_o48_forecast_round_trips_through_eccodes_and_cfgrib(tmp_path) -> None:
    path = tmp_path / "o48.zarr"
    command = [
        sys.executable,
        str(BENCHMARKS / "data" / "synthetic_dataset.py"),
        "--grid",
        "O48",
        "--dates",
        "4",
        "--out",
    ]
    subprocess.run([*command, str(path)], check=True, capture_output=True, timeout=120)
    store = open_anemoi_zarr(path)
    dataset = synthetic_forecast(store, steps=3)
    plan = grib_plan(tmp_path / "f.grib2", keys=KEYS, latitudes=store.latitudes, longitudes=store.longitudes,
                     grib=GribConfig(), members=1, ensemble_stats=False)  # fmt: skip
    assert plan.kind.name == "reduced_gg" and plan.kind.gaussian_number == 48
    write_grib(dataset, plan)
    found = messages(plan.path)
    assert len(found) == 3 * len(KEYS) and {m["gridType"] for m in found} == {"reduced_gg"}
    for index, message in enumerate(found):  # per step, the variables in order
        lead, name = index // len(KEYS), list(KEYS)[index % len(KEYS)]
        assert message["type"] == "fc" and message["stream"] == "oper" and "number" not in message
        expected = dataset[name].values[0, lead]
        check_message(message, expected, KEYS[name], date=store.dates[0], hours=6 * (lead + 1))
    check_coordinates(found[0], store.latitudes, store.longitudes)
    with xr.open_dataset(plan.path, **CFGRIB, filter_by_keys={"shortName": "u"}) as read:  # one level type
        assert read["u"].dims == ("step", "isobaricInhPa", "values") and read["time"].values == store.dates[0]
        np.testing.assert_array_equal(read["step"].values, dataset["step"].values)
        np.testing.assert_array_equal(read["isobaricInhPa"].values, [850, 250])
        np.testing.assert_allclose(read["latitude"].values, store.latitudes, rtol=0, atol=1e-6)
        np.testing.assert_allclose(read["longitude"].values, store.longitudes, rtol=0, atol=1e-6)
        expected = dataset["u_250"].values[0]  # (L, G)
        span = np.ptp(expected, axis=-1, keepdims=True)
        assert (np.abs(read["u"].sel(isobaricInhPa=250).values - expected) <= span / 2**16 + 1e-5).all()


def test_a_forecast_on_a_grid_removes_our_earlier_coordinates_file(builtin, tmp_path) -> None:
    """An unstructured forecast's OUT.grid.nc goes when a forecast on a GRIB grid replaces it at the same path."""
    store = open_anemoi_zarr(builtin)
    dataset, grid_file = synthetic_forecast(store, steps=1), tmp_path / "f.grib.grid.nc"
    for shift, kind in ((1.0, "unstructured"), (0.0, "regular_ll")):  # rows not from 0 east: unstructured
        plan = grib_plan(tmp_path / "f.grib", keys=KEYS, latitudes=store.latitudes, longitudes=store.longitudes + shift,
                         grib=GribConfig(), members=1, ensemble_stats=False)  # fmt: skip
        write_grib(dataset, plan)
        assert plan.kind.name == kind and grid_file.is_file() == (kind == "unstructured")
    assert sorted(tmp_path.iterdir()) == [tmp_path / "f.grib"]


def test_regular_gaussian_grid_coordinates_are_eccodes_own(tmp_path) -> None:
    gaussian, _ = gaussian_latitudes(16)
    latitudes, longitudes = np.repeat(gaussian, 64), np.tile(np.arange(64) * 5.625, 32)
    plan = grib_plan(tmp_path / "gg.grib", keys={"sp": KEYS["sp"]}, latitudes=latitudes, longitudes=longitudes,
                     grib=GribConfig(), members=1, ensemble_stats=False)  # fmt: skip
    values = np.cos(np.radians(latitudes)).astype(np.float32)[None, None, None, :, None]
    inputs = SimpleNamespace(
        store=SimpleNamespace(latitudes=latitudes, longitudes=longitudes, attrs={}, path="x"),
        roles=SimpleNamespace(output=["sp"], prognostic=["sp"]),
        steps=1,
        step=np.timedelta64(6, "h").item(),
        init_dates=np.array(["2000-01-01T12"], dtype="datetime64[s]"),
    )
    write_grib(forecast_dataset(values, inputs, checkpoint=Path("x.pt"), precision="fp32"), plan)
    (message,) = messages(plan.path)
    assert message["gridType"] == "regular_gg" and message["dataTime"] == 1200
    check_coordinates(message, latitudes, longitudes)


# --------------------------------------------------------------------------------------- a run of anemo-infer
def test_anemo_infer_writes_a_verified_grib_forecast(skilled, tmp_path) -> None:
    """The regular lat/lon grid: the GRIB file holds the netCDF forecast within the packing precision, and its
    verification scores are the netCDF run's."""
    common = ["dates=[2000-11-01T00,2000-11-05T00]", "lead_time=18h", "verify=true", *GRIB_TABLE]
    outputs = {}
    for name in ("forecast.grib", "forecast.nc"):
        config = infer_config(skilled, *common, f"output={tmp_path / name}", f"verification.output={tmp_path / name}.v")
        outputs[name] = run_inference(config)
    grib, netcdf = outputs["forecast.grib"], outputs["forecast.nc"]
    assert grib.verification is not None
    for kind, rmse in netcdf.verification.rmse.items():
        np.testing.assert_allclose(grib.verification.rmse[kind], rmse, rtol=1e-6)
    assert (grib.verification_output / "verification.md").is_file()
    found = messages(grib.forecast)
    with open_forecast(netcdf.forecast) as reference:
        assert len(found) == reference.sizes["time"] * reference.sizes["step"] * len(KEYS)
        order = [(n, lead, name) for n in range(2) for lead in range(3) for name in reference.data_vars]
        assert list(reference.data_vars) == list(KEYS)
        for message, (n, lead, name) in zip(found, order, strict=True):
            assert message["type"] == "fc" and message["stream"] == "oper" and message["gridType"] == "regular_ll"
            expected = reference[name].values[n, lead]
            check_message(message, expected, KEYS[name], date=reference["time"].values[n], hours=6 * (lead + 1))
        check_coordinates(found[0], reference["latitude"].values, reference["longitude"].values)
        with xr.open_dataset(grib.forecast, **CFGRIB, filter_by_keys={"shortName": "u"}) as read:
            assert read["u"].dims == ("time", "step", "isobaricInhPa", "latitude", "longitude")
            np.testing.assert_array_equal(read["time"].values, reference["time"].values)
            np.testing.assert_array_equal(read["step"].values, reference["step"].values)
            np.testing.assert_array_equal(read["isobaricInhPa"].values, [850, 250])
            np.testing.assert_allclose(read["latitude"].values, np.unique(reference["latitude"].values)[::-1])
            np.testing.assert_allclose(read["longitude"].values, np.unique(reference["longitude"].values))
            u_250 = read["u"].sel(isobaricInhPa=250).values.reshape(2, 3, -1)
            span = np.ptp(reference["u_250"].values, axis=-1, keepdims=True)
            assert (np.abs(u_250 - reference["u_250"].values) <= span / 2**16 + 1e-5).all()


# ------------------------------------------------------------------------- an ensemble on an unstructured grid
@pytest.fixture(scope="module")
def ensemble_model(tmp_path_factory, compose_run) -> tuple[Path, Path]:
    """(inference.pt, dataset): the tiny dataset's ensemble model, its noise modulation set at random."""
    folder = tmp_path_factory.mktemp("grib-ensemble")
    dataset = tiny_dataset(folder / "tiny.zarr")
    trained = Trainer(compose_run(folder / "run", [f"data.dataset={dataset}", *TINY_DATA, *FAST, *ENSEMBLE])).fit()
    state = torch.load(trained.inference_checkpoint, weights_only=True)
    generator = torch.Generator().manual_seed(0)
    for key in [key for key in state["state_dict"] if "modulation" in key]:
        state["state_dict"][key] = 0.2 * torch.randn(state["state_dict"][key].shape, generator=generator)
    torch.save(state, folder / "modulated.pt")
    return folder / "modulated.pt", dataset


TINY_TABLE = ["+grib.variables.sp={param: sp}", "+grib.variables.t_850={param: t, levtype: pl, levelist: 850}",
              "+grib.variables.z_500={param: z, levtype: pl, levelist: 500}"]  # fmt: skip


def test_ensemble_members_mean_and_spread_on_an_unstructured_grid(ensemble_model, tmp_path) -> None:
    checkpoint, dataset = ensemble_model
    overrides = [f"dataset={dataset}", "dates=[2000-01-04T00]", "lead_time=12h", "members=3", "ensemble_stats=true",
                 "grib.encoding.expver=abcd", *TINY_TABLE]  # fmt: skip
    grib = run_inference(infer_config(checkpoint, *overrides, f"output={tmp_path / 'f.grb2'}")).forecast
    netcdf = run_inference(infer_config(checkpoint, *overrides, f"output={tmp_path / 'f.nc'}")).forecast
    found = messages(grib)
    assert len(found) == 2 * 3 * (3 + 2)  # steps x variables x (members, mean, spread)
    names = ["sp", "t_850", "z_500"]
    order = [(lead, name, kind) for lead in range(2) for name in names for kind in ("1", "2", "3", "em", "es")]
    with open_forecast(netcdf) as reference:
        for message, (lead, name, kind) in zip(found, order, strict=True):
            assert message["stream"] == "enfo"
            assert message["numberOfForecastsInEnsemble"] == 3 and message["gridType"] == "unstructured_grid"
            if kind.isdigit():
                assert message["type"] == "pf" and message["number"] == int(kind)  # member + 1: 0 is a control
                expected = reference[name].values[0, int(kind) - 1, lead]
            else:
                assert message["type"] == kind and "number" not in message
                expected = reference[f"{name}_{dict(em='mean', es='spread')[kind]}"].values[0, lead]
            keys = {"sp": MarsKeys(param="sp"), "t_850": KEYS["t_850"], "z_500": KEYS["z_500"]}[name]
            date = np.datetime64("2000-01-04T00")
            check_message(message, expected, keys, date=date, hours=6 * (lead + 1), expver="abcd")
        t_850 = reference["t_850"].values[0]  # (M, L, G)
    with xr.open_dataset(tmp_path / "f.grb2.grid.nc") as grid:
        latitudes, longitudes = tiny_grid()
        np.testing.assert_array_equal(grid["latitude"].values, latitudes)
        np.testing.assert_array_equal(grid["longitude"].values, longitudes)
        assert grid.attrs["title"] == "anemo_like forecast grid" and len(grid.attrs["uuidOfHGrid"]) == 32
    with xr.open_dataset(grib, **CFGRIB, filter_by_keys={"dataType": "pf", "shortName": "t"}) as read:
        assert read["t"].dims == ("number", "step", "values") and read["isobaricInhPa"].values == 850
        np.testing.assert_array_equal(read["number"].values, [1, 2, 3])
        span = np.ptp(t_850, axis=-1, keepdims=True)
        assert (np.abs(read["t"].values - t_850) <= span / 2**16 + 1e-5).all()
    assert not list(tmp_path.glob(".f.grb2.tmp-*"))


def test_coordinates_file_replaces_only_one_of_ours(ensemble_model, tmp_path) -> None:
    checkpoint, dataset = ensemble_model
    output = tmp_path / "f.grib"
    grid_file = tmp_path / "f.grib.grid.nc"
    grid_file.write_text("someone's notes\n")
    overrides = [f"dataset={dataset}", "dates=[2000-01-04T00]", "lead_time=6h", *TINY_TABLE, f"output={output}"]
    message = setup_error(infer_config(checkpoint, *overrides))
    assert message == (
        f"output {output} is on an unstructured grid, whose coordinates go to {grid_file}, but that path holds "
        "something anemo-infer did not write: remove it yourself or choose another path (output=...)"
    )
    documented(message, OUT=output)
    assert grid_file.read_text() == "someone's notes\n" and sorted(tmp_path.iterdir()) == [grid_file]
    grid_file.unlink()
    for _ in range(2):  # its own coordinates file is replaced with the forecast
        run_inference(infer_config(checkpoint, *overrides))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.grib", "f.grib.grid.nc"]


@pytest.mark.skipif(not tmpfs_available(), reason="needs user namespaces to mount a small tmpfs")
def test_a_full_disk_while_writing_grib(ensemble_model, tmp_path) -> None:
    checkpoint, dataset = ensemble_model
    full = tmp_path / "small-disk"
    full.mkdir()
    command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={checkpoint}", f"dataset={dataset}",
               "dates=[2000-01-04T00]", "lead_time=18h", "members=3", *TINY_TABLE, f"output={full / 'f.grib'}",
               f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    assert on_small_disk(full, "8k", command) == (
        f"anemo-infer failed: DiskFull: no space left on the device holding {full / 'f.grib'} (No space left on "
        "device): free space there or choose another folder (output=...); nothing was written"
    )


def test_grib_write_benchmark_reports_both_formats() -> None:
    command = [
        sys.executable,
        str(BENCHMARKS / "speed" / "grib_write.py"),
        "--grid",
        "O48",
        "--steps",
        "2",
        "--repeats",
        "1",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["plan_kind"] == "reduced_gg" and report["messages"] == 14 and report["points"] == 10944
    assert report["grib_s"] > 0 and report["netcdf_s"] > 0 and 0 < report["grib_mib"] < report["netcdf_mib"]


@pytest.mark.parametrize("bits", [1, 2, 3, 8, 16])
def test_every_value_is_within_the_documented_packing_precision(bits, tmp_path) -> None:
    """Simple packing rounds to steps of at most 2 (max - min) / (2^bits - 1): every value within (max - min) /
    (2^bits - 1) of what was written, as docs/inference.md says, at any number of bits."""
    grid = regular_grid(32, 64)
    latitudes, longitudes, grib = grid.latitudes, grid.longitudes, GribConfig(bits_per_value=bits)
    plan = grib_plan(tmp_path / "p.grib", keys={"sp": KEYS["sp"]}, latitudes=latitudes, longitudes=longitudes,
                     grib=grib, members=1, ensemble_stats=False)  # fmt: skip
    fields = np.random.default_rng(bits).normal(1.0e5, 800.0, size=(1, 1, 6, latitudes.size, 1)).astype(np.float32)
    inputs = SimpleNamespace(
        store=SimpleNamespace(latitudes=latitudes, longitudes=longitudes, attrs={}, path="x"),
        roles=SimpleNamespace(output=["sp"], prognostic=["sp"]),
        steps=6,
        step=np.timedelta64(6, "h").item(),
        init_dates=np.array(["2000-01-01T00"], dtype="datetime64[s]"),
    )
    write_grib(forecast_dataset(fields, inputs, checkpoint=Path("x.pt"), precision="fp32"), plan)
    for message, written in zip(messages(plan.path), fields[0, 0, :, :, 0].astype(np.float64), strict=True):
        span = written.max() - written.min()
        assert np.abs(message["values"] - written).max() <= span / (2**bits - 1) * (1 + 1e-6)


def test_nan_is_written_as_missing_and_read_back_as_nan(tmp_path) -> None:
    """A forecast with NaN (an imputed variable passing its missing points through) writes a bitmap, not an
    ecCodes error after the forecast ran; our reader gives NaN there and a real value equal to GRIB's default
    missing value (9999) back as itself."""
    grid = regular_grid(8, 16)
    plan = grib_plan(tmp_path / "n.grib", keys={"z_500": KEYS["z_500"]}, latitudes=grid.latitudes,
                     longitudes=grid.longitudes, grib=GribConfig(), members=1, ensemble_stats=False)  # fmt: skip
    fields = np.random.default_rng(1).normal(10200.0, 30.0, size=(1, 1, 2, grid.latitudes.size, 1))  # 9999 its least
    fields[0, 0, 0, 5, 0], fields[0, 0, 0, :5, 0], fields[0, 0, 1, :, 0] = 9999.0, np.nan, np.nan  # lead 2 all NaN
    inputs = SimpleNamespace(
        store=SimpleNamespace(latitudes=grid.latitudes, longitudes=grid.longitudes, attrs={}, path="x"),
        roles=SimpleNamespace(output=["z_500"], prognostic=["z_500"]), steps=2, step=np.timedelta64(6, "h").item(),
        init_dates=np.array(["2000-01-01T00"], dtype="datetime64[s]"),
    )  # fmt: skip
    write_grib(forecast_dataset(fields.astype(np.float32), inputs, checkpoint=Path("x.pt"), precision="fp32"), plan)
    read = read_grib(plan.path, {"z_500": KEYS["z_500"]}).fields
    first, second = (read["z_500", np.datetime64(f"2000-01-01T{hour:02d}", "s")] for hour in (6, 12))
    assert np.array_equal(np.isnan(first), np.isnan(fields[0, 0, 0, :, 0])) and np.isnan(second).all()
    written = fields[0, 0, 0, 5:, 0]
    span = np.ptp(written)
    assert np.abs(first[5:] - written).max() <= span / (2**16 - 1) * (1 + 1e-6) + 1e-3

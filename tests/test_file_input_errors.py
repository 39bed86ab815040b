"""Bad initial-state files (``input=``): each is refused at set-up with one message, checked word for word against
its row in docs/errors.md ("Initial states from files"), before anything is written."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import xarray as xr
from file_input_helpers import GRIB_KEYS, HISTORY, INIT, grib_message, states, write_grib, write_netcdf
from inference_helpers import documented, infer_config, run_infer_cli, setup_error

from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.zarr_store import open_anemoi_zarr
from anemo_like.inference.netcdf_reader import read_netcdf
from anemo_like.inference.run import prepare

pytest.importorskip("eccodes")


@pytest.fixture(scope="module")
def store(builtin):
    return open_anemoi_zarr(builtin)


def refused(skilled, tmp_path, path, *overrides: str, error: type[Exception] = ValueError) -> str:
    """The set-up message of ``input=path``; nothing is written."""
    config = infer_config(
        skilled, f"input={path}", "lead_time=1d", f"output={tmp_path}/out/f.nc", *GRIB_KEYS, *overrides
    )
    message = setup_error(config, error)
    assert "\n" not in message and not (tmp_path / "out" / "f.nc").exists()
    print(message)
    return message


def test_grib_lacking_a_level(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store, names=[n for n in PROGNOSTIC if n != "z_500"])
    message = refused(skilled, tmp_path, path)
    assert message == (
        f"input {path} lacks z_500 (param z, levtype pl, levelist 500); it must hold every input variable of the "
        "model at each of its times: sp, t_850, u_250, u_850, v_250, v_850, z_500"
    )
    documented(message, FILE=path)


def test_grib_of_another_grid(skilled, store, tmp_path) -> None:
    path = tmp_path / "a.grib"
    path.write_bytes(b"".join(grib_message(n, INIT, np.zeros(512), shape=(16, 32)) for n in PROGNOSTIC))
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path, CHECKPOINT=skilled)


def test_truncated_grib(skilled, store, tmp_path) -> None:
    whole = write_grib(tmp_path / "whole.grib", store).read_bytes()
    path = tmp_path / "a.grib"
    path.write_bytes(whole[: len(whole) * 3 // 4])
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


def test_text_given_as_grib(skilled, tmp_path) -> None:
    path = tmp_path / "a.grib"
    path.write_text("date,t_850\n2000-11-02T00,271.5\n")
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


def test_duplicate_messages(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store)
    path.write_bytes(path.read_bytes() + grib_message("t_850", INIT, states(store, [INIT], ["t_850"])[0, 0]))
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


def test_date_not_in_the_file(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store)
    message = refused(skilled, tmp_path, path, "dates=[2000-11-05T00,2000-11-02T06]")
    documented(message, FILE=path)


def test_no_time_with_its_history(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store, dates=[INIT])
    message = refused(skilled, tmp_path, path)
    assert message == (
        f"input {path} has no time with the input history the model needs (2 states 6h apart); it holds only "
        "2000-11-02T00:00:00"
    )
    documented(message, FILE=path)


def test_variables_without_grib_parameter(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store)
    config = infer_config(skilled, f"input={path}", f"output={tmp_path}/f.nc")  # no grib.variables
    message = setup_error(config)
    documented(message, CHECKPOINT=skilled)


def test_missing_file(skilled, tmp_path) -> None:
    path = tmp_path / "a.grib"
    message = refused(skilled, tmp_path, path, error=FileNotFoundError)
    documented(message, FILE=path)


def test_netcdf_lacking_a_variable(skilled, store, tmp_path) -> None:
    path = write_netcdf(tmp_path / "a.nc", store, names=[n for n in PROGNOSTIC if n != "u_850"])
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


def test_grib_without_eccodes(skilled, store, tmp_path, monkeypatch) -> None:
    path = write_grib(tmp_path / "a.grib", store)
    netcdf = write_netcdf(tmp_path / "a.nc", store)
    monkeypatch.setitem(sys.modules, "eccodes", None)  # import eccodes fails, as where it is not installed
    message = refused(skilled, tmp_path, path)
    assert message == f"input {path} is GRIB, which needs ecCodes: pip install 'anemo_like[grib]'"
    documented(message, FILE=path)
    prepared = prepare(infer_config(skilled, f"input={netcdf}", "lead_time=1d", f"output={tmp_path}/f.nc"))
    assert prepared.inputs.init_dates.tolist() == [INIT]  # netCDF input needs no ecCodes


def test_cli_exits_2_with_one_line_and_writes_nothing(skilled, store, tmp_path) -> None:
    whole = write_grib(tmp_path / "whole.grib", store).read_bytes()
    path = tmp_path / "a.grib"
    path.write_bytes(whole[:1000])
    result = run_infer_cli([f"checkpoint={skilled}", f"input={path}", f"output={tmp_path}/f.nc", *GRIB_KEYS], tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr, result.stderr
    assert f"input {path} is not a complete GRIB file" in result.stdout + result.stderr
    assert not (tmp_path / "f.nc").exists()


def unreadable(path, names=("t_850",)) -> str:
    """The message of read_netcdf on ``path``, one line."""
    with pytest.raises(ValueError) as info:
        read_netcdf(path, list(names))
    message = str(info.value)
    assert "\n" not in message
    print(message)
    return message


def netcdf(path, data: dict, **coords):
    """A tiny netCDF file; by default 4 points along ``values`` with latitude/longitude, at INIT."""
    grid = {"latitude": ("values", np.zeros(4)), "longitude": ("values", np.zeros(4))}
    xr.Dataset(data, coords={"time": np.array([INIT], "datetime64[ns]"), **grid, **coords}).to_netcdf(path)
    return path


def test_text_given_as_netcdf(tmp_path) -> None:
    path = tmp_path / "a.nc"
    path.write_text("date,t_850\n2000-11-02T00,271.5\n")
    documented(unreadable(path), FILE=path)


def test_netcdf_without_latitude(tmp_path) -> None:
    path = tmp_path / "a.nc"
    times = {"time": np.array([INIT], "datetime64[ns]")}
    xr.Dataset({"t_850": (("time", "values"), np.zeros((1, 4)))}, coords=times).to_netcdf(path)
    documented(unreadable(path), FILE=path)


def test_netcdf_of_a_curvilinear_grid(tmp_path) -> None:
    curvilinear = {"latitude": (("y", "x"), np.zeros((2, 2))), "longitude": (("y", "x"), np.zeros((2, 2)))}
    path = netcdf(tmp_path / "a.nc", {"t_850": (("time", "y", "x"), np.zeros((1, 2, 2)))}, **curvilinear)
    documented(unreadable(path), FILE=path)


def test_netcdf_variable_without_time(tmp_path) -> None:
    path = tmp_path / "a.nc"
    grid = {"latitude": ("values", np.zeros(4)), "longitude": ("values", np.zeros(4))}
    xr.Dataset({"t_850": ("values", np.zeros(4))}, coords=grid).to_netcdf(path)
    documented(unreadable(path), FILE=path)


def test_netcdf_variable_of_other_dimensions(tmp_path) -> None:
    path = netcdf(tmp_path / "a.nc", {"t_850": (("number", "time", "values"), np.zeros((2, 1, 4)))})
    documented(unreadable(path), FILE=path)
    steps = {"step": np.array([6], "timedelta64[h]").astype("timedelta64[ns]")}
    path = netcdf(tmp_path / "b.nc", {"t_850": (("step", "values"), np.zeros((1, 4)))}, **steps)
    assert unreadable(path).startswith(f"input {path}: variable t_850 has dimensions (step, values); expected time")


def test_netcdf_field_held_twice(tmp_path) -> None:
    data = {"z_500": (("time", "values"), np.zeros((1, 4))), "z": (("time", "level", "values"), np.zeros((1, 2, 4)))}
    path = netcdf(tmp_path / "a.nc", data, level=[500, 850])
    documented(unreadable(path, ["z_500"]), FILE=path)
    path = tmp_path / "b.nc"
    grid = {"latitude": ("values", np.zeros(4)), "longitude": ("values", np.zeros(4))}
    times = np.array([INIT, INIT], "datetime64[ns]")
    xr.Dataset({"z_500": (("time", "values"), np.zeros((2, 4)))}, coords={"time": times, **grid}).to_netcdf(path)
    assert unreadable(path, ["z_500"]) == (
        f"input {path} holds z_500 at 2000-11-02T00:00:00 twice (in variable z_500, whose times repeat); keep one"
    )


def test_files_on_different_grids(skilled, store, tmp_path) -> None:
    first = write_grib(tmp_path / "a.grib", store, dates=[HISTORY])
    other = tmp_path / "b.grib"
    other.write_bytes(b"".join(grib_message(n, INIT, np.zeros(512), shape=(16, 32)) for n in PROGNOSTIC))
    message = refused(skilled, tmp_path, f"[{first},{other}]")
    documented(message.replace(str(other), "FILE"), FILE=first)


def test_grib_message_on_another_grid(skilled, store, tmp_path) -> None:
    path = write_grib(tmp_path / "a.grib", store, dates=[INIT], names=PROGNOSTIC[:-1])
    path.write_bytes(path.read_bytes() + grib_message(PROGNOSTIC[-1], INIT, np.zeros(512), shape=(16, 32)))
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


def test_grib_message_that_cannot_be_decoded(skilled, store, tmp_path) -> None:
    """The last message's bitsPerValue (octet 20 of section 5) says 60 bits: its data section is too short."""
    import eccodes

    last = bytearray(grib_message("z_500", INIT, states(store, [INIT], ["z_500"])[0, 0]))
    handle = eccodes.codes_new_from_message(bytes(last))
    last[eccodes.codes_get(handle, "offsetSection5") + 19] = 60
    eccodes.codes_release(handle)
    path = write_grib(tmp_path / "a.grib", store, dates=[INIT], names=PROGNOSTIC[:-1])
    path.write_bytes(path.read_bytes() + bytes(last))
    message = refused(skilled, tmp_path, path)
    documented(message, FILE=path)


PARAM_IDS = {"sp": 134, "t": 130, "u": 131, "v": 132, "z": 129}


def test_grib_matched_by_param_id(skilled, store, tmp_path) -> None:
    """grib.variables params given as paramId digits read the same messages as by shortName."""
    path = write_grib(tmp_path / "a.grib", store)
    by_id = [
        key.replace(f"param: {param},", f"param: '{number}',")
        for key in GRIB_KEYS
        for param, number in PARAM_IDS.items()
        if f"param: {param}," in key
    ]
    assert len(by_id) == len(GRIB_KEYS) and all("param: '1" in key for key in by_id)
    read = []
    for keys in (GRIB_KEYS, by_id):
        inputs = prepare(
            infer_config(skilled, f"input={path}", "lead_time=1d", f"output={tmp_path}/f.nc", *keys)
        ).inputs
        read.append(inputs.store.read(slice(0, 2), inputs.store.variable_indices(PROGNOSTIC)))
    assert np.array_equal(read[0], read[1])
    exact = states(store, [HISTORY, INIT])
    assert np.abs(read[1] - exact).max() <= 1e-5 * np.abs(exact).max()


def test_times_with_a_gap(skilled, store, tmp_path) -> None:
    """Between two times of the files, the states of the earlier one are read (only constant forcings are read
    there); a history state in the gap is refused, naming its time."""
    earlier = INIT - np.timedelta64(24, "h")
    path = write_grib(tmp_path / "a.grib", store, dates=[earlier, HISTORY, INIT])
    inputs = prepare(
        infer_config(skilled, f"input={path}", "lead_time=1d", f"output={tmp_path}/f.nc", *GRIB_KEYS)
    ).inputs
    assert inputs.store.dates.tolist() == [earlier + np.timedelta64(6 * k, "h") for k in range(5)]
    assert inputs.store.present.tolist() == [True, False, False, True, True]
    assert inputs.init_dates.tolist() == [INIT]
    held = inputs.store.read(slice(None), inputs.store.variable_indices(PROGNOSTIC))
    assert np.array_equal(held[1], held[0]) and np.array_equal(held[2], held[0])
    assert not np.array_equal(held[3], held[0])
    path = write_grib(tmp_path / "b.grib", store, dates=[earlier, INIT])
    message = refused(skilled, tmp_path, path, f"dates=[{INIT}]")
    assert message == (
        f"input {path} lacks the time(s) 2000-11-01T18:00:00 (input state of 2000-11-02T00:00:00): the model starts "
        "from 2 states 6h apart; the files hold 2 times from 2000-11-01T00:00:00 to 2000-11-02T00:00:00"
    )

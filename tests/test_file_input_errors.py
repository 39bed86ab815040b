"""Bad initial-state files (``input=``): each is refused at set-up with one message, checked word for word against
its row in docs/errors.md ("Initial states from files"), before anything is written."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from file_input_helpers import GRIB_KEYS, INIT, grib_message, states, write_grib, write_netcdf
from inference_helpers import documented, infer_config, run_infer_cli, setup_error

from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.zarr_store import open_anemoi_zarr
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

"""Overrides at the edges of the config tree: an entry of a mapping of sections the config defines is set (and a
misspelled key of it named), a whole section is never deleted silently; CF times past 2262 read from netCDF."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr
from inference_helpers import documented

from anemo_like.config import ConfigError
from anemo_like.config.inference import InferenceConfig, check_inference_override_keys
from anemo_like.config.validate import check_override_keys, check_schema_keys
from anemo_like.inference.netcdf_reader import read_netcdf


def refusal(check, *arguments: str) -> str:
    with pytest.raises(ConfigError) as error:
        check(list(arguments))
    return str(error.value).removeprefix("invalid configuration:\n  ")


def test_an_entry_of_a_mapping_the_config_defines_is_a_known_key() -> None:
    """grib.variables.sp is a section under a name the config gives (the quickstart's table): its keys are checked."""
    check_inference_override_keys(["grib.variables.sp.param=msl", "grib.variables.z_500.levelist=700"])
    assert refusal(check_inference_override_keys, "grib.variables.sp.parm=msl") == (
        "unknown config key 'grib.variables.sp.parm' (did you mean 'grib.variables.sp.param'?); allowed here: param, "
        "levtype, levelist"
    )


@pytest.mark.parametrize(
    ("check", "argument", "key"),
    [
        (check_override_keys, "~training", "training"),
        (check_override_keys, "~training.ema", "training.ema"),
        (check_override_keys, "~model.processor", "model.processor"),
        (check_inference_override_keys, "~verification", "verification"),
    ],
)
def test_a_whole_section_is_not_deleted(check, argument: str, key: str) -> None:
    message = refusal(check, argument)
    assert message == (
        f"cannot delete {key} ({argument}): it is a whole section, and the run would go on with every default of it; "
        f"delete or set keys inside it instead (~{key}.KEY, {key}.KEY=VALUE)"
    )
    if key == "training":
        documented(message)


def test_a_single_key_may_be_deleted() -> None:
    check_override_keys(["~training.ema.decay", "~diagnostics.plot_variable"])
    check_schema_keys(InferenceConfig, ["~verification.plot_lead"])


def test_cf_times_after_2262_are_read(tmp_path) -> None:
    """Nanosecond times end in 2262: a valid file of later dates is read at its dates, not called unreadable."""
    path = tmp_path / "future.nc"
    hours = {"units": "hours since 2300-01-01 00:00:00", "calendar": "standard"}
    coords = {"time": ("time", [0, 6], hours), "latitude": ("values", [10.0, 20.0]), "longitude": ("values", [0, 5.0])}
    xr.Dataset({"sp": (("time", "values"), np.ones((2, 2), np.float32))}, coords=coords).to_netcdf(path)
    read = read_netcdf(path, ["sp"])
    assert sorted(time for _, time in read.fields) == list(np.array(["2300-01-01T00", "2300-01-01T06"], "M8[s]"))

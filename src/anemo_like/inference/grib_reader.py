"""Read initial states from GRIB (editions 1 and 2) with ecCodes, matching messages to variables by MARS keys.

A message is variable ``name`` when its ``shortName`` is the variable's MARS ``param`` (or its ``paramId``, when the
param is digits) and its level matches: ``levtype`` pl is ``typeOfLevel`` isobaricInhPa at ``level`` = levelist
(hPa), ml is hybrid, pt theta, pv potentialVorticity, sol soilLayer / depthBelowLandLayer; sfc is any single-level
type (surface, meanSea, heightAboveGround, ...). Its time is the valid time ``validityDate``/``validityTime``
(dataDate/dataTime + step).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from anemo_like.config.inference import MarsKeys
from anemo_like.inference.mars_keys import LEVEL_TYPES, load_eccodes
from anemo_like.inference.state_source import FieldsRead

MULTI_LEVEL = {name for names in LEVEL_TYPES.values() for name in names} | {"isobaricInPa", "depthBelowLand"}


def describe_keys(keys: MarsKeys) -> str:
    """``param z, levtype pl, levelist 500`` (``param sp, levtype sfc``)."""
    level = "" if keys.levelist is None else f", levelist {keys.levelist}"
    return f"param {keys.param}, levtype {keys.levtype}{level}"


def _matches(keys: MarsKeys, message: Mapping[str, Any]) -> bool:
    param = str(message["paramId"]) if keys.param.isdigit() else message["shortName"]
    if param != keys.param:
        return False
    if keys.levtype == "sfc":
        return message["typeOfLevel"] not in MULTI_LEVEL
    return message["typeOfLevel"] in LEVEL_TYPES[keys.levtype] and int(message["level"]) == keys.levelist


def _valid_time(date: int, time: int) -> np.datetime64:
    """validityDate (YYYYMMDD) and validityTime (HHMM) -> datetime64[s]."""
    return np.datetime64(
        f"{date // 10000:04d}-{date // 100 % 100:02d}-{date % 100:02d}T{time // 100:02d}:{time % 100:02d}", "s"
    )


class _Messages:
    """The matched messages of one file, as they are read."""

    def __init__(self, ec: ModuleType, path: Path, keys: Mapping[str, MarsKeys]) -> None:
        self.ec, self.path, self.keys = ec, path, keys
        self.fields: dict[tuple[str, np.datetime64], np.ndarray] = {}
        self.units: dict[str, str] = {}  # each variable's unit (ecCodes' units key of its parameter)
        self.first: dict[tuple[str, np.datetime64], int] = {}  # the message number of each field
        self.grid: tuple[str, int, np.ndarray, np.ndarray] | None = None  # md5GridSection, message, lat, lon

    def take(self, handle: Any, number: int) -> None:
        """Keep message ``number`` if it is one of the variables: its values (G,) float32, NaN where missing."""
        ec = self.ec
        message = {key: ec.codes_get(handle, key) for key in ("shortName", "paramId", "typeOfLevel", "level")}
        name = next((name for name, keys in self.keys.items() if _matches(keys, message)), None)
        if name is None:
            return
        time = _valid_time(int(ec.codes_get(handle, "validityDate")), int(ec.codes_get(handle, "validityTime")))
        if (name, time) in self.fields:
            raise ValueError(
                f"input {self.path}: messages {self.first[name, time]} and {number} both hold {name} at {time} "
                f"({describe_keys(self.keys[name])}); keep one message per variable, level and valid time"
            )
        self._check_grid(handle, number, name)
        values = ec.codes_get_values(handle)
        if ec.codes_get(handle, "bitmapPresent"):  # the bitmap, not the missing value, which a real value may equal
            values[ec.codes_get_array(handle, "bitmap") == 0] = np.nan
        self.fields[name, time] = values.astype(np.float32)
        self.first[name, time] = number
        unit = str(ec.codes_get(handle, "units"))
        if unit not in ("", "unknown", "~"):
            self.units[name] = unit

    def _check_grid(self, handle: Any, number: int, name: str) -> None:
        md5 = self.ec.codes_get(handle, "md5GridSection")
        if self.grid is None:
            lat = self.ec.codes_get_array(handle, "latitudes").astype(np.float64)
            lon = self.ec.codes_get_array(handle, "longitudes").astype(np.float64)
            self.grid = (md5, number, lat, lon)
        elif md5 != self.grid[0]:
            raise ValueError(
                f"input {self.path}: message {number} ({name}) is on another grid than message {self.grid[1]}; "
                "give every field on the model's grid"
            )


def read_grib(path: Path, keys: Mapping[str, MarsKeys]) -> FieldsRead:
    """The fields of ``keys``' variables in GRIB file ``path``; ValueError naming the file and message at fault."""
    ec = load_eccodes(f"input {path}")
    messages = _Messages(ec, path, keys)
    number = 0
    with path.open("rb") as file:
        while True:
            try:
                handle = ec.codes_grib_new_from_file(file)
            except ec.GribInternalError as error:
                raise ValueError(
                    f"input {path} is not a complete GRIB file: message {number + 1} cannot be read ({error}); "
                    "copy or write the file again"
                ) from None
            if handle is None:
                break
            number += 1
            try:
                messages.take(handle, number)
            except ec.GribInternalError as error:
                raise ValueError(
                    f"input {path}: message {number} cannot be decoded ({error}); copy or write the file again"
                ) from None
            finally:
                ec.codes_release(handle)
    if number == 0:
        raise ValueError(f"input {path} holds no GRIB message: it is not a GRIB file")
    if messages.grid is None:
        return FieldsRead(path, np.zeros(0), np.zeros(0), {})
    _, _, lat, lon = messages.grid
    labels = {name: describe_keys(k) for name, k in keys.items()}
    return FieldsRead(path, lat, lon, messages.fields, labels, messages.units)

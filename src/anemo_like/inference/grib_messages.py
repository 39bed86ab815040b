"""GRIB2 message templates through ecCodes: the grid, a variable's parameter and level, the MARS labels
(ECMWF local definition 1) and the grib.encoding keys, set once per variable; each message then sets only its
date, step, member and values.

"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

import numpy as np

from anemo_like.config.inference import MarsKeys
from anemo_like.data.grid_kinds import GridKind
from anemo_like.inference.mars_keys import LEVEL_TYPES

# The marker of a GRIB file anemo-infer wrote (section 4 of every message): 'a', 'i' as octets.
MARKER = {"backgroundProcess": 97, "generatingProcessIdentifier": 105}
# grib.encoding keys anemo-infer sets itself, and what sets them
RESERVED = {
    **dict.fromkeys(MARKER, "it marks the files anemo-infer wrote"),
    **dict.fromkeys(
        ("type", "number", "numberOfForecastsInEnsemble", "productDefinitionTemplateNumber"),
        "fc, pf, em or es and the member number, per message",
    ),
    **dict.fromkeys(("dataDate", "dataTime", "step", "stepUnits"), "the initial date and lead time of each message"),
    **dict.fromkeys(("shortName", "paramId", "typeOfLevel", "level"), "from grib.variables or variables_metadata"),
    **dict.fromkeys(("bitsPerValue", "packingType"), "grib.bits_per_value, simple packing"),
    **dict.fromkeys(("gridType", "numberOfDataPoints", "numberOfValues"), "from the dataset's grid"),
}
FIRST = ("centre", "subCentre")  # set before the local definition, which depends on them


def grid_identity(latitudes: np.ndarray, longitudes: np.ndarray) -> str:
    """32 hex digits naming the grid points (uuidOfHGrid of an unstructured grid and its coordinates file)."""
    digest = hashlib.md5(usedforsecurity=False)
    for values in (latitudes, longitudes):
        digest.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
    return digest.hexdigest()


def set_grid(ec: ModuleType, handle: int, kind: GridKind, identity: str, size: int) -> None:
    """Set the grid section of ``handle`` (a GRIB2 sample) for ``kind`` (``size`` points); an unstructured grid
    is template 3.101 naming ``identity`` (uuidOfHGrid), its coordinates in a separate file."""
    if kind.name == "unstructured":
        ec.codes_set(handle, "gridDefinitionTemplateNumber", 101)
        ec.codes_set(handle, "numberOfGridUsed", 1)
        ec.codes_set(handle, "numberOfGridInReference", 1)
        ec.codes_set_string(handle, "uuidOfHGrid", identity)
        ec.codes_set(handle, "numberOfDataPoints", size)
        return
    rows, columns = kind.row_latitudes, int(kind.row_sizes.max())
    if kind.name == "reduced_gg":
        ec.codes_set(handle, "N", kind.gaussian_number)
        ec.codes_set_array(handle, "pl", kind.row_sizes)
    elif kind.name == "regular_gg":
        ec.codes_set(handle, "N", kind.gaussian_number)
        ec.codes_set(handle, "Ni", columns)
    else:
        ec.codes_set(handle, "Ni", columns)
        ec.codes_set(handle, "jDirectionIncrementInDegrees", float(rows[0] - rows[1]))
        ec.codes_set(handle, "iDirectionIncrementInDegrees", 360.0 / columns)
    ec.codes_set(handle, "Nj", len(rows))
    ec.codes_set(handle, "latitudeOfFirstGridPointInDegrees", float(rows[0]))
    ec.codes_set(handle, "latitudeOfLastGridPointInDegrees", float(rows[-1]))
    ec.codes_set(handle, "longitudeOfFirstGridPointInDegrees", 0.0)
    ec.codes_set(handle, "longitudeOfLastGridPointInDegrees", 360.0 - 360.0 / columns)


SAMPLES = {kind: f"{kind}_pl_grib2" for kind in ("regular_ll", "regular_gg", "reduced_gg")}  # compiled in


def grid_handle(ec: ModuleType, kind: GridKind, *, identity: str, size: int, bits: int) -> int:
    """A new GRIB2 handle on the grid of ``kind``, simple packing of ``bits`` bits."""
    handle = ec.codes_grib_new_from_samples(SAMPLES.get(kind.name, "GRIB2"))
    set_grid(ec, handle, kind, identity, size)
    ec.codes_set_string(handle, "packingType", "grid_simple")
    ec.codes_set(handle, "bitsPerValue", bits)
    return handle


def set_marker(ec: ModuleType, handle: int) -> None:
    """Mark ``handle`` as written by anemo-infer (after the product definition template is chosen)."""
    for key, value in MARKER.items():
        ec.codes_set(handle, key, value)


def set_encoding(ec: ModuleType, handle: int, encoding: Mapping[str, str | int], *, stream: str) -> None:
    """Set ``centre``/``subCentre`` of ``encoding``, the MARS local definition (stream ``stream`` unless given),
    then the other keys. ValueError names the grib.encoding key that ecCodes does not know or whose value it
    refuses, or that anemo-infer sets itself."""
    for key in encoding:
        if key in RESERVED:
            raise ValueError(
                f"grib.encoding.{key} is set by anemo-infer ({RESERVED[key]}); remove it from grib.encoding"
            )
    for key in (k for k in FIRST if k in encoding):
        _set_key(ec, handle, key, encoding[key])
    _local_definition(ec, handle, encoding, stream=stream)
    for key in (k for k in encoding if k not in FIRST):
        _set_key(ec, handle, key, encoding[key])


def _local_definition(ec: ModuleType, handle: int, encoding: Mapping[str, str | int], *, stream: str) -> None:
    try:
        ec.codes_set(handle, "setLocalDefinition", 1)
        ec.codes_set(handle, "localDefinitionNumber", 1)
        ec.codes_set_string(handle, "stream", stream)
    except ec.GribInternalError:
        key = next((k for k in FIRST if k in encoding), None)
        if key is None:
            raise
        raise ValueError(
            f"grib.encoding.{key}={encoding[key]!r}: ecCodes refuses this value (it has no MARS local definition for "
            "class, stream, type and expver with it; add subCentre: 98 for ECMWF's); use a value ecCodes accepts"
        ) from None


def _set_key(ec: ModuleType, handle: int, key: str, value: str | int) -> None:
    try:
        if isinstance(value, str):
            ec.codes_set_string(handle, key, value)
        else:
            ec.codes_set(handle, key, value)
    except ec.KeyValueNotFoundError:
        raise ValueError(
            f"grib.encoding.{key}: ecCodes knows no GRIB key '{key}'; remove it or use a key of GRIB2 with ECMWF's "
            "local definition 1 (class, stream, expver, centre, ...)"
        ) from None
    except ec.GribInternalError as error:
        raise ValueError(
            f"grib.encoding.{key}={value!r}: ecCodes refuses this value ({error}); use a value ecCodes accepts"
        ) from None


def set_parameter(ec: ModuleType, handle: int, keys: MarsKeys, *, name: str) -> None:
    """Set the parameter (shortName, or paramId for digits) and level of ``keys``; a surface parameter keeps the
    level ecCodes gives it (2t: 2 m above ground). ValueError names ``name`` when ecCodes refuses them."""
    try:
        ec.codes_set_string(handle, "typeOfLevel", "surface")  # no level left from the sample; 2t then sets its own
        if keys.param.isdigit():
            ec.codes_set(handle, "paramId", int(keys.param))
        else:
            ec.codes_set_string(handle, "shortName", keys.param)
        if keys.levtype != "sfc":
            ec.codes_set_string(handle, "typeOfLevel", LEVEL_TYPES[keys.levtype][0])
            ec.codes_set(handle, "level", keys.levelist)
    except ec.GribInternalError as error:
        level = "" if keys.levelist is None else f", levelist: {keys.levelist}"
        raise ValueError(
            f"variable {name}: ecCodes has no GRIB2 parameter {{param: {keys.param}, levtype: {keys.levtype}{level}}} "
            f"({error}); map it in grib.variables to a parameter of ecCodes' table (https://codes.ecmwf.int/grib/param-db/)"
        ) from None


def grib_origin(ec: ModuleType, path: Path) -> str:
    """``ours`` when the first message of the file at ``path`` is GRIB2 carrying :data:`MARKER`, ``grib`` for
    another GRIB file, ``other`` for anything else (not GRIB, unreadable)."""
    try:
        with open(path, "rb") as file:
            if file.read(4) != b"GRIB":
                return "other"
        with open(path, "rb") as file:  # ecCodes reads from the start of a file it opens
            handle = ec.codes_grib_new_from_file(file)
    except (OSError, ec.GribInternalError):
        return "other"
    if handle is None:
        return "other"
    try:
        marked = ec.codes_get(handle, "edition") == 2 and all(
            ec.codes_get(handle, key) == value for key, value in MARKER.items()
        )
    except ec.GribInternalError:
        marked = False
    finally:
        ec.codes_release(handle)
    return "ours" if marked else "grib"

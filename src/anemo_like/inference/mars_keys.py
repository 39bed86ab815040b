"""Each variable's GRIB identity in MARS keys (param, levtype, levelist), for GRIB output and GRIB input.

The config's ``grib.variables`` table comes first; then the ``variables_metadata[name].mars`` that the checkpoint
stores (written by training from its dataset), then that of the dataset given to anemo-infer. A variable with none
is refused by name, never written under a made-up code.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import ValidationError

from anemo_like.config.inference import MarsKeys
from anemo_like.data.zarr_store import AnemoiZarr

# MARS levtype -> the GRIB typeOfLevel of its levels: the first is written, all are read
LEVEL_TYPES: dict[str, tuple[str, ...]] = {
    "pl": ("isobaricInhPa",),
    "ml": ("hybrid",),
    "pt": ("theta",),
    "pv": ("potentialVorticity",),
    "sol": ("soilLayer", "depthBelowLandLayer"),
}


def load_eccodes(what: str) -> ModuleType:
    """The ``eccodes`` module; ValueError naming ``what`` (``output PATH``, ``input PATH``) when it, or the ecCodes
    library it loads, is not installed. ecCodes is imported only through here (the optional ``grib`` extra)."""
    try:
        return importlib.import_module("eccodes")
    except (ImportError, RuntimeError):  # RuntimeError: the Python package without its library
        raise ValueError(f"{what} is GRIB, which needs ecCodes: pip install 'anemo_like[grib]'") from None


def metadata_sources(
    checkpoint: Path, stored: Mapping[str, Mapping[str, Any]], dataset: AnemoiZarr | None
) -> list[tuple[str, Mapping[str, Mapping[str, Any]]]]:
    """Where MARS keys are looked up after grib.variables: the checkpoint's stored variables_metadata, then the
    dataset's (when one is opened), each named for messages."""
    sources = [(f"checkpoint {checkpoint}", stored)]
    if dataset is not None:
        sources.append((f"dataset {dataset.path}", dataset.attrs.get("variables_metadata") or {}))
    return sources


def _from_metadata(entry: Mapping[str, Any] | None) -> MarsKeys | None:
    """The MARS keys of one ``variables_metadata`` entry, or None when it has no usable ``mars`` block."""
    mars = (entry or {}).get("mars")
    if not isinstance(mars, Mapping) or "param" not in mars:
        return None
    levtype = str(mars.get("levtype", "sfc"))
    level = mars.get("levelist", mars.get("level"))
    try:
        return MarsKeys(
            param=str(mars["param"]),
            levtype=levtype,
            levelist=None if levtype == "sfc" or level is None else int(level),
        )
    except (ValidationError, TypeError, ValueError):
        return None


def resolve_mars_keys(
    names: Sequence[str],
    *,
    table: Mapping[str, MarsKeys],
    metadata: Sequence[tuple[str, Mapping[str, Mapping[str, Any]]]],
) -> dict[str, MarsKeys]:
    """MARS keys of each of ``names``: ``table`` (grib.variables) first, then each (source, variables_metadata) of
    ``metadata`` in order. Raise ValueError naming every variable without keys, the sources searched and the fix."""
    keys: dict[str, MarsKeys] = {}
    for name in names:
        found = table.get(name)
        for _, entries in metadata:
            if found is not None:
                break
            found = _from_metadata(entries.get(name))
        if found is not None:
            keys[name] = found
    missing = [name for name in names if name not in keys]
    if missing:
        searched = ", ".join(["grib.variables", *(f"the variables_metadata of {source}" for source, _ in metadata)])
        raise ValueError(
            f"no GRIB parameter for the variable(s) {', '.join(missing)}: none in {searched}; map each in "
            f"grib.variables, e.g. '+grib.variables.{missing[0]}={_guess(missing[0])}'"
        )
    _check_distinct(keys, table)
    return keys


def _check_distinct(keys: Mapping[str, MarsKeys], table: Mapping[str, MarsKeys]) -> None:
    """Two variables of one GRIB field (param, levtype, level) would write (or read) one message for both: refused,
    naming the grib.variables entries that did it."""
    fields: dict[tuple[str, str, int | None], list[str]] = {}
    for name, found in keys.items():
        fields.setdefault((found.param, found.levtype, found.levelist), []).append(name)
    for (param, levtype, level), names in fields.items():
        if len(names) > 1:
            mapped = [f"grib.variables.{name}" for name in names if name in table] or ["grib.variables"]
            field = f"{param}, levtype {levtype}" + ("" if level is None else f", level {level}")
            raise ValueError(
                f"the variables {' and '.join(names)} map to one GRIB field ({field}), so one would hide the other; "
                f"give each its own MARS keys (check {' and '.join(mapped)})"
            )


def _guess(name: str) -> str:
    """The likely MARS keys of ``name`` in anemoi-datasets' naming (``z_500``: z on 500 hPa; else a surface
    field), as a Hydra override value, for the refusal's example."""
    if match := re.fullmatch(r"(.+)_(\d+)", name):
        return f"{{param: {match.group(1)}, levtype: pl, levelist: {match.group(2)}}}"
    return f"{{param: {name}, levtype: sfc}}"

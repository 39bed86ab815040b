"""Each variable's GRIB identity in MARS keys (param, levtype, levelist), for GRIB output and GRIB input.

The config's ``grib.variables`` table comes first; then the ``variables_metadata[name].mars`` that the checkpoint
stores (written by training from its dataset), then that of the dataset given to anemo-infer. A variable with none
is refused by name, never written under a made-up code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from anemo_like.config.inference import MarsKeys


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
        example = missing[0]
        raise ValueError(
            f"no GRIB parameter for the variable(s) {', '.join(missing)}: none in {searched}; map each in "
            f"grib.variables, e.g. '+grib.variables.{example}={{param: t, levtype: pl, levelist: 850}}'"
        )
    return keys


def mars_name(keys: MarsKeys) -> str:
    """The anemoi-datasets name of ``keys``: ``param_levelist`` (z_500), or ``param`` for a surface field."""
    return keys.param if keys.levelist is None else f"{keys.param}_{keys.levelist}"

"""Units of the fields read from input files, converted to the units the model was trained in.

A field's unit comes from its file (netCDF ``units`` attribute, GRIB ``units`` key); the model's from the training
dataset's ``variables_metadata`` (stored in the checkpoint), else from the parameter's usual unit in anemoi-datasets
(``t``: K, ``z``: m² s⁻², ``sp``/``msl``: Pa, ``u``/``v``: m s⁻¹). Known units are converted (temperature K, °C, °F;
geopotential m² s⁻² and geopotential height m, gpm; pressure Pa, hPa, mbar, kPa; speed m s⁻¹, km h⁻¹, knots);
anything else that differs is refused, naming the variable, the file's unit and the model's. A field without a unit
is read as it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

STANDARD_GRAVITY = 9.80665  # m s-2: geopotential = g0 x geopotential height


@dataclass(frozen=True)
class Unit:
    """``kind`` and the affine map to its base unit: base = value * scale + offset."""

    kind: str
    scale: float = 1.0
    offset: float = 0.0


UNITS = {
    "k": Unit("temperature"),
    "kelvin": Unit("temperature"),
    "degc": Unit("temperature", 1.0, 273.15),
    "c": Unit("temperature", 1.0, 273.15),
    "celsius": Unit("temperature", 1.0, 273.15),
    "degcelsius": Unit("temperature", 1.0, 273.15),
    "degf": Unit("temperature", 5.0 / 9.0, 273.15 - 32.0 * 5.0 / 9.0),
    "fahrenheit": Unit("temperature", 5.0 / 9.0, 273.15 - 32.0 * 5.0 / 9.0),
    "degfahrenheit": Unit("temperature", 5.0 / 9.0, 273.15 - 32.0 * 5.0 / 9.0),
    "m2s-2": Unit("geopotential"),
    "jkg-1": Unit("geopotential"),
    "m": Unit("height"),
    "gpm": Unit("height"),
    "metre": Unit("height"),
    "meter": Unit("height"),
    "pa": Unit("pressure"),
    "hpa": Unit("pressure", 100.0),
    "mbar": Unit("pressure", 100.0),
    "mb": Unit("pressure", 100.0),
    "millibar": Unit("pressure", 100.0),
    "kpa": Unit("pressure", 1000.0),
    "ms-1": Unit("speed"),
    "kmh-1": Unit("speed", 1.0 / 3.6),
    "kt": Unit("speed", 1852.0 / 3600.0),
    "knot": Unit("speed", 1852.0 / 3600.0),
    "knots": Unit("speed", 1852.0 / 3600.0),
}
USUAL = {"t": "K", "z": "m2 s-2", "sp": "Pa", "msl": "Pa", "u": "m s-1", "v": "m s-1", "w": "Pa s-1", "q": "kg kg-1"}
"""The unit anemoi-datasets' variables of these parameters are in, where a dataset records none."""


def _key(unit: str) -> str:
    """A spelling-free form: lower case, without spaces, exponent signs and degree words; ``a/b2`` as ``ab-2``
    (``m**2 s**-2``, ``m^2/s^2`` and ``m2 s-2`` are one unit)."""
    text = unit.strip().lower().replace("°", "deg").replace("**", "").replace("^", "")
    text = re.sub(r"degrees?[\s_]*", "deg", text)
    text = re.sub(r"/\s*([a-z]+)(\d*)", lambda m: f" {m.group(1)}-{m.group(2) or 1}", text)
    return re.sub(r"[\s.·_]", "", text)


def same_unit(first: str, second: str) -> bool:
    """Whether two spellings name one unit (``m**2 s**-2`` and ``m2 s-2``)."""
    return _key(first) == _key(second)


def usual_unit(name: str) -> str | None:
    """The usual unit of variable ``name`` (``t_850``: its parameter ``t``), None when not known."""
    return USUAL.get(re.sub(r"_\d+$", "", name))


def to_model_units(values: np.ndarray, name: str, unit: str | None, target: str | None, where: str) -> np.ndarray:
    """``values`` of variable ``name`` in ``unit`` (None: the file says none) in ``target`` (None: the model's is not
    known); ``where`` names the file. ValueError when the units differ and are not both known."""
    if unit is None or target is None or same_unit(unit, target):
        return values
    given, wanted = UNITS.get(_key(unit)), UNITS.get(_key(target))
    pair = {getattr(given, "kind", None), getattr(wanted, "kind", None)}
    if given is None or wanted is None or (given.kind != wanted.kind and pair != {"geopotential", "height"}):
        known = "" if given is not None else " (a unit anemo-infer does not know)"
        raise ValueError(
            f"{where}: {name} is in '{unit}'{known} and the model reads it in '{target}': convert it to {target}, or "
            "correct its units attribute"
        )
    base = values.astype(np.float64) * given.scale + given.offset
    if given.kind == "height" and wanted.kind == "geopotential":
        base = base * STANDARD_GRAVITY
    elif given.kind == "geopotential" and wanted.kind == "height":
        base = base / STANDARD_GRAVITY
    return ((base - wanted.offset) / wanted.scale).astype(values.dtype)

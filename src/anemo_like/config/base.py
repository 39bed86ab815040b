"""What every config section shares: the strict base model and small value rules."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

TIMESTEP = re.compile(r"^\d+[mhd]$")  # a duration: whole number and unit m, h or d ("30m", "6h", "1d")


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, values are type-checked, and a float must be finite
    (``inf`` and ``nan`` are refused: ``lr=inf`` would otherwise train to NaN and save as ``lr: null``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0

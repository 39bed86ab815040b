"""What every config section shares: the strict base model and small value rules."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

TIMESTEP = re.compile(r"^\d+[mhd]$")  # a duration: whole number and unit m, h or d ("30m", "6h", "1d")
# a random seed: numpy's legacy seeding (np.random.seed, training's seed_everything) takes 0 .. 2**32 - 1
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


def _not_empty(path: str) -> str:
    if not path.strip():
        raise ValueError("an empty path would mean the current folder; give a path")
    return path


PathText = Annotated[str, AfterValidator(_not_empty)]  # a path that must not be empty (or only spaces)


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, values are type-checked, and a float must be finite
    (``inf`` and ``nan`` are refused: ``lr=inf`` would otherwise train to NaN and save as ``lr: null``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0

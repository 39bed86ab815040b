"""Validated ``anemo-infer`` configuration: the pydantic mirror of the Hydra YAML tree in ``inference/config``.

Like the training schema it forbids unknown keys and imports no torch, so a bad key fails in well under a second.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from anemo_like.config.base import TIMESTEP, PathText, Seed, Strict
from anemo_like.config.validate import check_schema_keys, validate_schema

GRIB_SUFFIXES = (".grib", ".grib2", ".grb", ".grb2")
OUTPUT_SUFFIXES = (".nc", ".zarr", *GRIB_SUFFIXES)
INPUT_SUFFIXES = (".nc", *GRIB_SUFFIXES)
LEVTYPES = ("sfc", "pl", "ml", "pt", "pv", "sol")  # MARS level types; sfc has no level
_DURATION_HINT = "expected a whole number and a unit m, h or d, e.g. '6h', '5d'"


def inference_config_dir() -> Path:
    """The config tree: ``anemo_like/_inference_config`` in an installed wheel, ``inference/config`` in a checkout."""
    packaged = Path(__file__).resolve().parents[1] / "_inference_config"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[3] / "inference" / "config"


def _duration(value: str | None) -> str | None:
    if value is not None and not TIMESTEP.match(value):
        raise ValueError(_DURATION_HINT)
    return value


def _iso_date(value: str) -> str:
    try:
        np.datetime64(value, "s")
    except ValueError:
        raise ValueError(f"cannot parse date {value!r}; expected ISO 8601 like 2000-11-01T06") from None
    return value


class DateRange(Strict):
    """Initial dates from ``start`` to ``end`` (inclusive), ``every`` apart."""

    start: str | None = Field(None, description="first initial date, ISO 8601 (e.g. 2000-11-01T00)")
    end: str | None = Field(None, description="last initial date, inclusive; null: start (one forecast)")
    every: str = Field("1d", description="spacing of the initial dates, a multiple of the dataset frequency")

    @field_validator("start", "end")
    @classmethod
    def _date_parses(cls, value: str | None) -> str | None:
        return value if value is None else _iso_date(value)

    @field_validator("every")
    @classmethod
    def _every_format(cls, value: str) -> str:
        return _duration(value)


class VerificationConfig(Strict):
    """What ``verify=true`` writes beside the forecast."""

    output: str | None = Field(
        None, description="folder of verification.md, verification.json and the plots; null: the output's folder"
    )
    plot_variable: str | None = Field(None, description="variable of the forecast map; null: the first prognostic")
    plot_lead: str | None = Field(
        None, description="lead time of the forecast map and rank histograms; null: the longest one scored"
    )
    climatology_dates: int = Field(
        365, ge=0, description="training-split dates (evenly spaced) averaged into the climatology baseline; 0: none"
    )

    @field_validator("plot_lead")
    @classmethod
    def _lead_format(cls, value: str | None) -> str | None:
        return _duration(value)


class MarsKeys(Strict):
    """A variable's GRIB identity in MARS keys, as anemoi-datasets' ``variables_metadata[name].mars`` holds it."""

    param: str = Field(description="GRIB shortName (z, t, 2t, msl) or paramId as digits (129)")
    levtype: Literal[LEVTYPES] = Field("sfc", description="sfc (no level), pl (pressure, hPa), ml (model level), ...")
    levelist: int | None = Field(None, ge=0, description="the level: hPa for pl, the model level for ml; null for sfc")

    @model_validator(mode="after")
    def _level_fits_type(self) -> MarsKeys:
        if self.levtype == "sfc" and self.levelist is not None:
            raise ValueError(f"levtype sfc has no level; remove levelist ({self.levelist}) or set levtype (e.g. pl)")
        if self.levtype != "sfc" and self.levelist is None:
            raise ValueError(f"levtype {self.levtype} needs a levelist (the level, e.g. 500)")
        return self


class GribConfig(Strict):
    """How ``output=*.grib`` encodes the forecast and how ``input=*.grib`` files are matched (docs/inference.md)."""

    bits_per_value: int = Field(
        16, ge=1, le=32, description="simple packing precision: each value within range / (2**bits - 1)"
    )
    encoding: dict[str, str | int] = Field(
        default_factory=lambda: {"class": "ml", "expver": "0001"},
        description="GRIB keys set on every message (class, stream, expver, centre, ...); stream defaults to oper, "
        "or enfo for an ensemble",
    )
    variables: dict[str, MarsKeys] = Field(
        default_factory=dict,
        description="MARS keys of variables, by name; they take precedence over the dataset's variables_metadata",
    )


class InferenceConfig(Strict):
    """The whole composed configuration of one ``anemo-infer`` run."""

    checkpoint: PathText = Field(description="inference.pt written by anemo-train")
    dataset: str | None = Field(
        None, description="anemoi-datasets zarr of the initial states (and truth); null: the checkpoint's data.dataset"
    )
    input: str | list[str] | None = Field(
        None,
        description="initial states from files instead of the dataset: a GRIB (.grib, .grib2) or netCDF (.nc) file, "
        "or a list of them; null: the dataset",
    )
    boundary: str | None = Field(
        None,
        description="a limited-area model's boundary from a global forecast file (.nc or .zarr written by anemo-infer "
        "with a global model, from the same initial dates); null: the dataset's boundary values",
    )
    dates: list[str] | None = Field(
        None, description="initial dates, ISO 8601; null: use date_range (with input: the last time in the files)"
    )
    date_range: DateRange = DateRange()
    lead_time: str = Field("5d", description="forecast length, a multiple of the model step")
    output: str = Field(
        description="forecast file: .nc (netCDF), .zarr or .grib / .grib2 (GRIB2), replaced if anemo-infer wrote it"
    )
    grib: GribConfig = GribConfig()
    batch_size: int = Field(1, ge=1, description="forecasts (initial dates x members) run together in one forward pass")
    members: int = Field(
        1, ge=1, description="ensemble members per initial date; > 1 needs a checkpoint with processor noise"
    )
    seed: Seed = Field(0, description="seed of the members' processor noise")
    ensemble_stats: bool = Field(
        False, description="also write <var>_mean and <var>_spread (ddof 1) over the members (members > 1)"
    )
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto: cuda when torch sees a GPU")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="bf16 / fp16: model weights and activations in that precision; the file is float32"
    )
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads; null keeps torch's default")
    cuda_graphs: bool = Field(
        False,
        description="replay each step's forward pass as a CUDA graph, captured once per batch shape (one GPU "
        "per model copy; docs/inference.md)",
    )
    memory_budget_gb: float | None = Field(
        None,
        gt=0,
        description="memory the run may use; on a CPU it plans the mapper and processor chunks and whether the "
        "weights are read from the checkpoint part by part (the fastest plan predicted to fit; docs/memory.md); a "
        "forecast that cannot fit is refused; null: what the device has (CPU: MemAvailable, within RLIMIT_AS; GPU: "
        "its total memory, the held forecast the host's), no plan",
    )
    num_gpus_per_model: int | None = Field(
        None,
        ge=1,
        description="ranks sharing one model copy (launched with torchrun or srun); the other ranks form copies that "
        "split the initial dates; null: the checkpoint's where it divides the world, else 1",
    )
    collective_timeout_minutes: float = Field(
        30, gt=0, description="a collective that waits longer fails instead of hanging (several ranks)"
    )
    verify: bool = Field(False, description="score the written forecast against the dataset (docs/inference.md)")
    verification: VerificationConfig = VerificationConfig()

    @field_validator("lead_time")
    @classmethod
    def _lead_format(cls, value: str) -> str:
        return _duration(value)

    @field_validator("dates")
    @classmethod
    def _dates_parse(cls, dates: list[str] | None) -> list[str] | None:
        if dates is not None:
            if not dates:
                raise ValueError("give at least one date, or null to use date_range")
            for date in dates:
                _iso_date(date)
        return dates

    @field_validator("output")
    @classmethod
    def _output_format(cls, output: str) -> str:
        if Path(output).suffix not in OUTPUT_SUFFIXES:
            raise ValueError(f"the suffix picks the format: end the path in {', '.join(OUTPUT_SUFFIXES)}")
        return output

    @field_validator("input")
    @classmethod
    def _input_format(cls, value: str | list[str] | None) -> str | list[str] | None:
        paths = [value] if isinstance(value, str) else value or []
        if isinstance(value, list) and not value:
            raise ValueError("give at least one file, or null to start from the dataset")
        for path in paths:
            if not path.strip():
                raise ValueError("an empty path; give a GRIB or netCDF file")
            if Path(path).suffix.lower() not in INPUT_SUFFIXES:
                raise ValueError(f"{path}: the suffix picks the format: end the path in {', '.join(INPUT_SUFFIXES)}")
        return value

    @model_validator(mode="after")
    def _one_way_to_give_dates(self) -> InferenceConfig:
        if self.dates is not None and self.date_range.start is not None:
            raise ValueError("set either dates (a list) or date_range.start, not both")
        if self.dates is None and self.date_range.start is None and self.input is None:
            raise ValueError("no initial dates: set dates=[...] or date_range.start=...")
        return self

    @model_validator(mode="after")
    def _stats_need_members(self) -> InferenceConfig:
        if self.ensemble_stats and self.members < 2:
            raise ValueError(f"ensemble_stats=true needs members of 2 or more (got members={self.members})")
        return self


def validate_inference_config(config: Mapping[str, Any]) -> InferenceConfig:
    """Validate a resolved config mapping; raise :class:`ConfigError` listing every problem."""
    return validate_schema(InferenceConfig, config)


def check_inference_override_keys(arguments: list[str]) -> None:
    """Reject command-line overrides ``key=value`` whose key the schema does not know, with a suggestion."""
    check_schema_keys(InferenceConfig, arguments)

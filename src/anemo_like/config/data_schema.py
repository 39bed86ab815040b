"""Config sections ``data`` (the dataset, its variables and splits) and ``dataloader`` (how samples are read)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from anemo_like.config.base import TIMESTEP, PathText, Seed, Strict

NormalizerName = Literal["mean-std", "std", "min-max", "max", "none"]
ComputedForcing = Literal[  # data/forcings.py computes each as earthkit-data (anemoi-datasets) does
    "cos_julian_day",
    "sin_julian_day",
    "cos_local_time",
    "sin_local_time",
    "cos_latitude",
    "sin_latitude",
    "cos_longitude",
    "sin_longitude",
    "insolation",
    "cos_solar_zenith_angle",
]
NanPolicy = Literal["error", "mask"]


# ----------------------------------------------------------------------------------------------- data
class VariablesConfig(Strict):
    """Role of each dataset variable. Prognostic: input and output; forcing: input only; diagnostic: output only."""

    prognostic: list[str] = Field(min_length=1)
    forcing: list[str] = Field(default_factory=list)
    diagnostic: list[str] = Field(default_factory=list)
    computed_forcing: list[ComputedForcing] = Field(default_factory=list)

    @model_validator(mode="after")
    def _roles_are_disjoint(self) -> VariablesConfig:
        seen: dict[str, str] = {}
        for role in ("prognostic", "forcing", "diagnostic"):
            for name in getattr(self, role):
                if name in seen:
                    raise ValueError(f"variable '{name}' is listed as both {seen[name]} and {role}")
                seen[name] = role
        return self


class NormalizerConfig(Strict):
    """Per-variable normalisation from the dataset statistics."""

    default: NormalizerName = "mean-std"
    per_variable: dict[str, NormalizerName] = Field(default_factory=dict)


class DateWindow(Strict):
    """Inclusive date window; ``None`` means the dataset's first (start) or last (end) date. A bare year (``2020``,
    as anemoi's configs write it) is the year."""

    start: str | None = None
    end: str | None = None

    @field_validator("start", "end", mode="before")
    @classmethod
    def _year_is_a_date(cls, value: object) -> object:
        return str(value) if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 9999 else value


class SplitsConfig(Strict):
    train: DateWindow = DateWindow()
    val: DateWindow = DateWindow()
    allow_overlap: bool = Field(
        False,
        description="let the train and val windows share dates of one dataset (validation then scores dates the model "
        "trained on); false: overlapping windows are refused at set-up. Ignored with a data.val_dataset of its own",
    )


class CutoutConfig(Strict):
    """A regional dataset inset into ``data.dataset`` (a global one): one grid, regional points first."""

    dataset: PathText = Field(
        description="the regional anemoi-datasets zarr, or 'builtin-region' for the generated regional dataset; same "
        "variables, dates and frequency as data.dataset"
    )
    min_distance_km: float | None = Field(
        None,
        gt=0,
        description="global points closer than this (km) to a regional point are dropped; null: the regional grid's "
        "spacing (the median distance from a regional point to its nearest neighbour)",
    )


class BoundaryConfig(Strict):
    """A limited-area ``data.dataset`` whose boundary strip takes the values of a global source interpolated there."""

    dataset: PathText = Field(
        description="the global anemoi-datasets zarr forcing the boundary, or 'builtin-global' for the generated "
        "global dataset; same variables, dates and frequency as data.dataset"
    )
    width_km: float | None = Field(
        None, gt=0, description="the strip: points at most this far (km) from the region's edge; or width_rows"
    )
    width_rows: int | None = Field(
        None, ge=1, description="the strip's width in regional grid spacings (median nearest-neighbour distance)"
    )

    @model_validator(mode="after")
    def _one_width(self) -> BoundaryConfig:
        if (self.width_km is None) == (self.width_rows is None):
            given = "both" if self.width_km is not None else "neither"
            raise ValueError(
                f"set exactly one of width_km and width_rows, got {given} (width_km={self.width_km}, "
                f"width_rows={self.width_rows})"
            )
        return self


class DataConfig(Strict):
    dataset: PathText = Field(
        description="path to an anemoi-datasets zarr, or 'builtin' for the generated dataset ('builtin-global', "
        "'builtin-region': the generated regional pair)"
    )
    val_dataset: str | None = Field(
        None,
        description="validate on another anemoi-datasets zarr of the same grid (another trajectory or period); "
        "data.splits.val picks its dates, data.dataset's statistics normalise it; null: data.dataset",
    )
    builtin_seed: Seed = Field(
        0, description="seed of the built-in dataset's initial perturbation (data.dataset builtin)"
    )
    variables: VariablesConfig
    normalizer: NormalizerConfig = NormalizerConfig()
    splits: SplitsConfig = SplitsConfig()
    timestep: str = Field("6h", description="model time step, a multiple of the data frequency")
    nan_policy: NanPolicy = Field(
        "error", description="NaN/inf in a sample: error names the date and variables; mask leaves them out of the loss"
    )
    cutout: CutoutConfig | None = Field(
        None, description="inset a regional dataset into data.dataset (stretched-grid mode); null: none"
    )
    boundary: BoundaryConfig | None = Field(
        None,
        description="force the edge of data.dataset (a regional one) from a global source (limited-area mode); "
        "null: none",
    )

    @model_validator(mode="after")
    def _one_regional_mode(self) -> DataConfig:
        if self.cutout is not None and self.boundary is not None:
            raise ValueError(
                "cutout (a regional dataset inset into a global one) and boundary (a regional dataset forced at its "
                "edge) are two regional modes; set one of them to null"
            )
        return self

    @field_validator("timestep")
    @classmethod
    def _timestep_format(cls, v: str) -> str:
        if not TIMESTEP.match(v):
            raise ValueError("expected a whole number and a unit m, h or d, e.g. '30m', '6h', '1d'")
        return v


# ----------------------------------------------------------------------------------------- dataloader
class BatchSizes(Strict):
    train: int = Field(2, ge=1, description="samples per step and model instance")
    val: int = Field(8, ge=1)


class Workers(Strict):
    train: int = Field(0, ge=0, description="reader processes; 0 reads in the training process")
    val: int = Field(0, ge=0)


class BatchLimits(Strict):
    train: int | None = Field(
        None, ge=1, description="global batches per pass over the training samples (then a fresh shuffle); None: all"
    )
    val: int | None = Field(None, ge=1, description="validation batches scored; None: all")


class DataloaderConfig(Strict):
    batch_size: BatchSizes = BatchSizes()
    num_workers: Workers = Workers()
    prefetch_factor: int | None = Field(
        None,
        ge=1,
        description="batches each worker reads ahead; needs num_workers > 0; None: 2 per worker (docs/throughput.md)",
    )
    pin_memory: bool = Field(True, description="page-locked host batches for faster copies to a GPU; no effect on CPU")
    persistent_workers: bool | None = Field(
        None,
        description="keep worker processes between validations; needs num_workers > 0; None: on when there are workers",
    )
    normalize_on_device: bool = Field(
        False, description="workers send physical values; the training device normalises them (frees worker CPU)"
    )
    read_group_size: int | None = Field(
        None,
        ge=1,
        description="ranks of a model instance that read one sample together, each its slice of the grid, then "
        "gather it; divides system.hardware.num_gpus_per_model; None: all of them",
    )
    limit_batches: BatchLimits = BatchLimits()

    @model_validator(mode="after")
    def _worker_options_need_workers(self) -> DataloaderConfig:
        if self.num_workers.train or self.num_workers.val:
            return self
        for key, value in (("prefetch_factor", self.prefetch_factor), ("persistent_workers", self.persistent_workers)):
            if value is not None and value is not False:
                raise ValueError(
                    f"dataloader.{key}={str(value).lower()} needs worker processes, but "
                    "dataloader.num_workers.train and .val are both 0: raise dataloader.num_workers.train (and .val) "
                    f"or set dataloader.{key}=null"
                )
        return self

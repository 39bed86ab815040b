"""Config keys ``training.loss`` (which loss) and ``training.scalers`` (what weighs it: nodes and variables).

Every loss is an error term averaged over the grid with the node weights and summed over the output variables with
the variable weights (``training.variable_loss_weights`` times the scalers), missing targets left out;
:mod:`anemo_like.training.loss` and :mod:`anemo_like.training.scalers` compute them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from anemo_like.config.base import Strict

TermName = Literal["mse", "mae", "huber"]
LossName = Literal["mse", "mae", "huber", "combined", "crps", "afcrps"]
ENSEMBLE_LOSSES = ("crps", "afcrps")


class LossTerm(Strict):
    """One term of a ``combined`` loss: a loss and its weight in the sum."""

    name: TermName
    weight: float = Field(1.0, ge=0, description="the term's factor in the weighted sum")

    @field_validator("name", mode="before")
    @classmethod
    def _not_nested(cls, name: object) -> object:
        if name == "combined":
            raise ValueError("a term of a combined loss cannot be 'combined' itself; use mse, mae or huber")
        return name


class LossConfig(Strict):
    """``name``: the loss; ``huber_delta``: where huber turns from squared to absolute; ``terms``: a combined loss."""

    name: LossName = Field(
        "mse",
        description="mse (squared error), mae (absolute error), huber, combined (a weighted sum of terms); for "
        "ensembles (training.ensemble.members > 1): crps (fair CRPS) or afcrps (almost-fair CRPS)",
    )
    alpha: float = Field(
        0.95, gt=0, le=1, description="afcrps: weight of the fair CRPS, the rest on the standard one (1: fair CRPS)"
    )
    huber_delta: float = Field(
        1.0, gt=0, description="huber: |error| (normalised units) where the squared part turns absolute"
    )
    terms: list[LossTerm] = Field(
        default_factory=list,
        description="combined only: e.g. [{name: mse, weight: 1.0}, {name: mae, weight: 0.5}]",
    )

    @model_validator(mode="after")
    def _terms_fit_name(self) -> LossConfig:
        if self.name != "combined":
            if self.terms:
                raise ValueError(
                    f"terms are read only with name: combined (name is {self.name}); set name=combined or remove terms"
                )
            return self
        if not self.terms:
            raise ValueError(
                "name: combined needs at least one entry in terms, e.g. [{name: mse, weight: 1.0}, {name: mae, "
                "weight: 0.5}]"
            )
        if all(term.weight == 0 for term in self.terms):
            raise ValueError("terms: every weight is 0, so the loss would be 0; give at least one term a weight > 0")
        return self


class PressureLevelScaler(Strict):
    """Weight of a pressure-level variable from its level in hPa (surface variables: 1)."""

    kind: Literal["none", "linear", "relu"] = Field(
        "none", description="none: 1; linear: slope x level; relu: max(minimum, slope x level) (anemoi's default)"
    )
    slope: float = Field(0.001, gt=0, description="weight per hPa")
    minimum: float = Field(0.2, ge=0, description="relu: the smallest weight (upper levels)")


class TendencyScaler(Strict):
    """Weight of a prognostic output from the spread of its change over one model step (diagnostic outputs: 1)."""

    kind: Literal["none", "variance", "stdev"] = Field(
        "none",
        description="none: 1; variance: (scale / tendency stdev)^2 (for mse); stdev: scale / tendency stdev (for "
        "mae); scale is the variable's normalisation scale (its stdev for mean-std)",
    )
    max_dates: int = Field(
        365,
        ge=1,
        description="without the dataset's statistics_tendencies_<timestep>_stdev: date pairs (evenly spaced in "
        "the training split) whose differences give the tendency stdev",
    )


def eastward(west: float, east: float) -> float:
    """Degrees from ``west`` east to ``east`` (across 0 degrees when east < west)."""
    return east - west if east > west else east - west + 360.0


class NodeMask(Strict):
    """A latitude/longitude box (degrees); grid points outside it get weight 0."""

    latitude: tuple[float, float] = Field((-90.0, 90.0), description="[south, north], within [-90, 90]")
    longitude: tuple[float, float] = Field(
        (0.0, 360.0), description="[west, east], the box runs east from west (e.g. [-25, 45] or [330, 45])"
    )

    @field_validator("latitude")
    @classmethod
    def _south_to_north(cls, latitude: tuple[float, float]) -> tuple[float, float]:
        south, north = latitude
        if not -90 <= south <= north <= 90:
            raise ValueError(f"must be [south, north] with -90 <= south <= north <= 90, got {list(latitude)}")
        return latitude

    @field_validator("longitude")
    @classmethod
    def _west_to_east(cls, longitude: tuple[float, float]) -> tuple[float, float]:
        west, east = longitude
        if not (-180 <= west <= 360 and -180 <= east <= 360) or west == east or not 0 < eastward(*longitude) <= 360:
            raise ValueError(
                f"must be [west, east] in degrees within [-180, 360], different meridians at most 360 apart, got "
                f"{list(longitude)}"
            )
        return longitude


class NodeScaler(Strict):
    """The weight of each grid point in the loss."""

    weights: Literal["area", "uniform"] = Field("area", description="area: the graph's area weights; uniform: 1")
    mask: NodeMask | None = Field(None, description="regional fine-tuning: points outside this box get weight 0")
    region_weight: float | None = Field(
        None,
        gt=0,
        description="a dataset with a region mask (data.cutout): the regional points' weight times this, relative "
        "to the rest; null: no change. Boundary points of a limited-area dataset always get weight 0",
    )


class ScalersConfig(Strict):
    """Weights multiplying the loss, as anemoi's scalers: per node, and per variable (times
    ``training.variable_loss_weights``)."""

    pressure_level: PressureLevelScaler = PressureLevelScaler()
    tendency: TendencyScaler = TendencyScaler()
    nodes: NodeScaler = NodeScaler()

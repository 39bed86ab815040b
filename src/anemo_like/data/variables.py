"""Which dataset variables are read, and where each role sits in the sample and model tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from anemo_like.config.schema import VariablesConfig


@dataclass(frozen=True)
class VariableRoles:
    """Sample variable axis = [prognostic, forcing, diagnostic, computed forcing].

    Model input = [prognostic, forcing, computed forcing]; model output = [prognostic, diagnostic].
    """

    prognostic: list[str]
    forcing: list[str]
    diagnostic: list[str]
    computed: list[str]

    @classmethod
    def from_config(cls, config: VariablesConfig) -> VariableRoles:
        return cls(
            list(config.prognostic), list(config.forcing), list(config.diagnostic), list(config.computed_forcing)
        )

    @property
    def read(self) -> list[str]:
        """Variables read from the dataset, in sample order."""
        return self.prognostic + self.forcing + self.diagnostic

    @property
    def sample(self) -> list[str]:
        return self.read + self.computed

    @property
    def input(self) -> list[str]:
        return self.prognostic + self.forcing + self.computed

    @property
    def output(self) -> list[str]:
        return self.prognostic + self.diagnostic

    def sample_positions(self, names: list[str]) -> list[int]:
        index = {name: i for i, name in enumerate(self.sample)}
        return [index[n] for n in names]

    def metadata(self, attrs: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The ``variables_metadata`` entries (units, mars keys, ...) of the sample's variables in a dataset's
        ``attrs``; variables without one are left out."""
        stored = attrs.get("variables_metadata") or {}
        return {name: dict(stored[name]) for name in self.sample if isinstance(stored.get(name), dict)}


@dataclass(frozen=True)
class VariableLayout:
    """How variables enter and leave the model (indices into the model's input / output variable axis)."""

    num_input: int
    num_output: int
    prognostic_input: list[int]  # input positions of the prognostic variables ...
    prognostic_output: list[int]  # ... and their output positions, in the same order
    relu_floor: dict[int, float]  # output position -> normalised value the output is floored at
    boundary_inputs: bool = False  # a limited-area model: it also reads the forced values of the states it predicts
    imputed: dict[int, float] = field(default_factory=dict)  # input position -> normalised value NaN is replaced by
    restored: dict[int, int] = field(default_factory=dict)  # output position -> input position whose NaN (first
    # input state) the output gets back: an imputed variable stays missing where it was missing

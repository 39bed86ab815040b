"""Validated run configuration: the pydantic mirror of the Hydra YAML tree in ``training/config``.

Every model forbids unknown keys, so a typo fails before any work starts. This module imports no torch,
so validation runs in well under a second. Each section lives in its own module (``data_schema``,
``model_schema``, ``training_schema``, ``system_schema``); this one holds :class:`RunConfig`, the rules across
sections, and re-exports every section class so ``from anemo_like.config.schema import X`` keeps working.

``system.hardware.num_gpus_per_model`` is validated here, and only here, against the rest of the config
(:meth:`RunConfig._num_gpus_per_model_fits`); only its fit to the world size waits for the launch.
"""

from __future__ import annotations

from pydantic import model_validator

from anemo_like.config.base import TIMESTEP, Strict, is_power_of_two
from anemo_like.config.data_schema import (
    BatchLimits,
    BatchSizes,
    ComputedForcing,
    DataConfig,
    DataloaderConfig,
    DateWindow,
    NanPolicy,
    NormalizerConfig,
    NormalizerName,
    SplitsConfig,
    VariablesConfig,
    Workers,
)
from anemo_like.config.loss_schema import (
    LossConfig,
    LossTerm,
    NodeMask,
    NodeScaler,
    PressureLevelScaler,
    ScalersConfig,
    TendencyScaler,
)
from anemo_like.config.model_schema import (
    _SHARD_STRATEGY,
    CompileEntry,
    GraphConfig,
    MapperConfig,
    ModelConfig,
    NoiseConfig,
    ProcessorConfig,
    ShardStrategy,
    TrainableSizes,
)
from anemo_like.config.system_schema import (
    BenchConfig,
    DiagnosticsConfig,
    HardwareConfig,
    MemorySnapshotConfig,
    PathsConfig,
    ProfileConfig,
    SystemConfig,
)
from anemo_like.config.training_schema import (
    EnsembleConfig,
    OptimizerConfig,
    Precision,
    RolloutConfig,
    TrainingConfig,
)

_TIMESTEP = TIMESTEP  # the names this module had before the sections moved out
_is_power_of_two = is_power_of_two

__all__ = [
    "_SHARD_STRATEGY",
    "_TIMESTEP",
    "BatchLimits",
    "BatchSizes",
    "BenchConfig",
    "CompileEntry",
    "ComputedForcing",
    "DataConfig",
    "DataloaderConfig",
    "DateWindow",
    "DiagnosticsConfig",
    "EnsembleConfig",
    "GraphConfig",
    "HardwareConfig",
    "LossConfig",
    "LossTerm",
    "MapperConfig",
    "MemorySnapshotConfig",
    "ModelConfig",
    "NanPolicy",
    "NodeMask",
    "NodeScaler",
    "NoiseConfig",
    "NormalizerConfig",
    "NormalizerName",
    "OptimizerConfig",
    "PathsConfig",
    "Precision",
    "PressureLevelScaler",
    "ProcessorConfig",
    "ProfileConfig",
    "RolloutConfig",
    "RunConfig",
    "ScalersConfig",
    "ShardStrategy",
    "SplitsConfig",
    "Strict",
    "SystemConfig",
    "TendencyScaler",
    "TrainableSizes",
    "TrainingConfig",
    "VariablesConfig",
    "Workers",
    "_is_power_of_two",
]


class RunConfig(Strict):
    """The whole composed configuration of one ``anemo-train`` run."""

    data: DataConfig
    dataloader: DataloaderConfig = DataloaderConfig()
    graph: GraphConfig = GraphConfig()
    model: ModelConfig = ModelConfig()
    training: TrainingConfig = TrainingConfig()
    system: SystemConfig
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()

    @model_validator(mode="after")
    def _cross_section_rules(self) -> RunConfig:
        outputs = set(self.data.variables.prognostic + self.data.variables.diagnostic)
        unknown = set(self.model.relu_bounded) - outputs
        if unknown:
            raise ValueError(f"model.relu_bounded names {sorted(unknown)}, which are not output variables")
        unknown = set(self.training.variable_loss_weights) - outputs
        if unknown:
            raise ValueError(f"training.variable_loss_weights names {sorted(unknown)}, which are not output variables")
        if all(self.training.variable_loss_weights.get(name, 1.0) == 0 for name in outputs):
            raise ValueError("training.variable_loss_weights sets every output variable's weight to 0")
        self._num_gpus_per_model_fits()
        self._ensemble_fits()
        plot = self.diagnostics.plot_variable
        if plot is not None and plot not in outputs:
            raise ValueError(
                f"diagnostics.plot_variable '{plot}' is not an output variable; choose from {sorted(outputs)}"
            )
        return self

    def _ensemble_fits(self) -> None:
        """Members need processor noise to differ, and divide over ``system.hardware.num_gpus_per_ensemble``."""
        members, per_ensemble = self.training.ensemble.members, self.system.hardware.num_gpus_per_ensemble
        if members > 1 and self.model.noise is None:
            raise ValueError(
                f"training.ensemble.members={members} needs model.noise (on the command line: "
                "+model.noise.channels=16): without noise every member is the same forecast"
            )
        if members == 1 and self.model.noise is not None:
            raise ValueError(
                "model.noise makes the processor stochastic, which only an ensemble trains: set "
                "training.ensemble.members to 2 or more (with training.loss.name crps or afcrps), or model.noise=null"
            )
        if members % per_ensemble:
            raise ValueError(
                f"system.hardware.num_gpus_per_ensemble={per_ensemble} must divide training.ensemble.members "
                f"({members})"
            )

    def _num_gpus_per_model_fits(self) -> None:
        """``system.hardware.num_gpus_per_model``: a power of two dividing ``model.num_heads``, divisible by
        ``dataloader.read_group_size``."""
        per_model, heads = self.system.hardware.num_gpus_per_model, self.model.num_heads
        if not is_power_of_two(per_model) or per_model > heads:
            raise ValueError(
                f"system.hardware.num_gpus_per_model={per_model} must be a power of two and at most model.num_heads "
                f"({heads})"
            )
        if heads % per_model:
            raise ValueError(f"model.num_heads ({heads}) must be divisible by system.hardware.num_gpus_per_model")
        read = self.dataloader.read_group_size
        if read is not None and per_model % read:
            raise ValueError(
                f"dataloader.read_group_size={read} must divide system.hardware.num_gpus_per_model={per_model}"
            )

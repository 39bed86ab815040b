"""Config section ``training``: steps, precision, rollout, validation, checkpoints and the optimiser."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from anemo_like.config.base import Seed, Strict
from anemo_like.config.loss_schema import ENSEMBLE_LOSSES, LossConfig, ScalersConfig


class RolloutConfig(Strict):
    """Autoregressive steps in the loss: ``start``, raised by one every ``increase_every`` steps up to ``max``."""

    start: int = Field(1, ge=1)
    max: int = Field(1, ge=1)
    increase_every: int = Field(0, ge=0, description="0 keeps the rollout at start")

    @model_validator(mode="after")
    def _start_le_max(self) -> RolloutConfig:
        if self.start > self.max:
            raise ValueError(f"start ({self.start}) must be at most max ({self.max})")
        return self


class OptimizerConfig(Strict):
    lr: float = Field(1e-3, gt=0)
    lr_min: float = Field(1e-5, ge=0, description="learning rate the cosine decay ends at, at most lr")
    warmup_steps: int = Field(50, ge=0)
    betas: tuple[float, float] = Field((0.9, 0.95), description="AdamW's decay rates of the moments, each in [0, 1)")
    weight_decay: float = Field(0.1, ge=0)
    gradient_clip_norm: float | None = Field(1.0, gt=0)
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="scale lr (and lr_min) by the number of model instances (linear) or its square root"
    )
    fused: bool = Field(
        True, description="fused AdamW kernels where the device supports them, else foreach (with a log line)"
    )

    @field_validator("betas")
    @classmethod
    def _betas_below_one(cls, betas: tuple[float, float]) -> tuple[float, float]:
        """Adam's decay rates: 1 would never forget (the moments stop moving), a negative one oscillates."""
        for i, beta in enumerate(betas, start=1):
            if not 0 <= beta < 1:
                raise ValueError(
                    f"Adam's betas must each be at least 0 and below 1, got beta{i} = {beta}; e.g. [0.9, 0.95]"
                )
        return betas

    @model_validator(mode="after")
    def _lr_min_le_lr(self) -> OptimizerConfig:
        if self.lr_min > self.lr:
            raise ValueError(
                f"lr_min ({self.lr_min}) must be at most lr ({self.lr}): the schedule decays lr down to lr_min"
            )
        return self


class EmaConfig(Strict):
    """An exponential moving average of the weights, used for validation and written to ``inference.pt``."""

    decay: float | None = Field(
        None, ge=0, lt=1, description="weight of the old average per step (e.g. 0.999); null: no averaging"
    )


class EnsembleConfig(Strict):
    """Members per model instance: each starts from the same state (or its own member of an ensemble dataset) and
    draws its own processor noise (``model.noise``); the loss scores them together (``training.loss``: crps)."""

    members: int = Field(1, ge=1, description="forecasts per initial state; 1: a deterministic model")


Precision = Literal["32", "tf32", "bf16-mixed", "16-mixed", "bf16"]


class TrainingConfig(Strict):
    seed: Seed = Field(42, description="seeds Python, numpy and torch at start, and the members' processor noise")
    precision: Precision = Field(
        "32",
        description="32; tf32 (fp32 matmuls in TF32 on GPUs); bf16-mixed / 16-mixed (autocast, 16-mixed with a "
        "gradient scaler); bf16 (weights, optimiser state and activations in bf16)",
    )
    cuda_graphs: bool = Field(False, description="capture one training step as a CUDA graph and replay it (CUDA only)")
    cuda_graph_warmup: int = Field(20, ge=1, description="eager steps before the capture")

    @field_validator("precision", mode="before")
    @classmethod
    def _precision_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # YAML reads 32 as a number

    multistep_input: int = Field(2, ge=1)
    multistep_output: int = Field(1, ge=1, description="future states the decoder predicts per forward pass")
    rollout: RolloutConfig = RolloutConfig()
    lead_loss_weights: list[float] = Field(
        default_factory=list,
        description="weight of each lead's loss in the rollout loss (lead k, from 1: entry min(k, len)); the loss is "
        "the weighted mean over leads; empty: all leads equal",
    )
    val_rollout: int = Field(1, ge=1, description="autoregressive steps scored at validation")
    val_climatology_dates: int = Field(
        365, ge=0, description="training dates (evenly spaced) averaged into the climatology baseline; 0: none"
    )
    max_steps: int = Field(1000, ge=1)
    max_minutes: float | None = Field(None, gt=0, description="stop early when this wall-clock budget is spent")
    val_every_n_steps: int = Field(200, ge=1)
    checkpoint_every_n_steps: int = Field(200, ge=1)
    checkpoint_every_minutes: float | None = Field(None, gt=0, description="also checkpoint when this much time passed")
    checkpoint_keep_last: int = Field(3, ge=1, description="step checkpoints kept (checkpoints/step-*.pt)")
    max_nonfinite_steps: int = Field(
        3,
        ge=1,
        description="consecutive steps with a non-finite loss or gradient norm (each skipped) that stop training",
    )
    optimizer: OptimizerConfig = OptimizerConfig()
    variable_loss_weights: dict[str, float] = Field(default_factory=dict)

    @field_validator("lead_loss_weights")
    @classmethod
    def _lead_weights_usable(cls, weights: list[float]) -> list[float]:
        if any(w <= 0 for w in weights):
            raise ValueError(f"every weight must be > 0, got {weights}")
        return weights

    @field_validator("variable_loss_weights")
    @classmethod
    def _weights_usable(cls, weights: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in weights.items() if v < 0}
        if negative:
            raise ValueError(f"weights must be >= 0, got {negative}")
        return weights

    loss: LossConfig = LossConfig()
    scalers: ScalersConfig = ScalersConfig()

    resume: str | None = Field(
        None, description="training checkpoint to continue from; 'auto': the run folder's latest, if any"
    )
    init_from: str | None = Field(
        None,
        description="inference.pt or training checkpoint whose weights start this run, by parameter name (shapes "
        "that differ, and the trainable node and edge features of another graph, stay freshly initialised); "
        "optimiser, schedule and step start fresh",
    )
    init_statistics: Literal["dataset", "checkpoint"] = Field(
        "dataset", description="normalisation statistics of a warm start: the new dataset's or init_from's"
    )
    init_model: Literal["config", "checkpoint"] = Field(
        "config",
        description="the model a warm start trains: config (this run's model, graph and variables, init_from's "
        "weights by name) or checkpoint (init_from's own: an inference.pt's architecture, graph, variables, "
        "normalisation, layout and multistep, as an imported anemoi model needs; chunking and backends stay this "
        "run's)",
    )
    freeze: list[str] = Field(
        default_factory=list, description="module paths (e.g. encoder, processor.layers.0) that are not trained"
    )
    ema: EmaConfig = EmaConfig()
    ensemble: EnsembleConfig = EnsembleConfig()

    @model_validator(mode="after")
    def _rollout_covers_output_steps(self) -> TrainingConfig:
        if self.rollout.max < self.multistep_output:
            raise ValueError(
                f"rollout.max ({self.rollout.max}) is below multistep_output ({self.multistep_output}): the last "
                "states each forward pass predicts would never be trained; raise rollout.max"
            )
        return self

    @model_validator(mode="after")
    def _ensemble_loss_fits_members(self) -> TrainingConfig:
        members, loss = self.ensemble.members, self.loss.name
        if members > 1 and loss not in ENSEMBLE_LOSSES:
            raise ValueError(
                f"ensemble.members={members} needs an ensemble loss: set loss.name to crps or afcrps (got {loss}); "
                "a pointwise loss would train every member to the same mean"
            )
        if members == 1 and loss in ENSEMBLE_LOSSES:
            raise ValueError(f"loss.name={loss} scores an ensemble: set ensemble.members to 2 or more (got 1)")
        return self

    @model_validator(mode="after")
    def _init_model_has_a_checkpoint(self) -> TrainingConfig:
        if self.init_model == "checkpoint" and self.init_from is None:
            raise ValueError("init_model=checkpoint takes the model of init_from: set init_from to an inference.pt")
        return self

    @model_validator(mode="after")
    def _init_from_is_not_resume(self) -> TrainingConfig:
        if self.init_from is not None and self.resume not in (None, "auto"):
            raise ValueError(
                f"init_from ({self.init_from}) and resume ({self.resume}) cannot be combined: resume continues a "
                "run exactly, init_from starts a new one from its weights; set one of them"
            )
        return self

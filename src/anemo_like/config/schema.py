"""Validated run configuration: the pydantic mirror of the Hydra YAML tree in ``training/config``.

Every model forbids unknown keys, so a typo fails before any work starts. This module imports no torch,
so validation runs in well under a second.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

NormalizerName = Literal["mean-std", "min-max", "none"]
ComputedForcing = Literal["cos_julian_day", "sin_julian_day", "cos_local_time", "sin_local_time"]
NanPolicy = Literal["error", "mask"]
_TIMESTEP = re.compile(r"^\d+[mhd]$")


class Strict(BaseModel):
    """Base for every config section: unknown keys are errors, values are type-checked."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


# ----------------------------------------------------------------------------------------------- data
class VariablesConfig(Strict):
    """Role of each dataset variable. Prognostic: input and output; forcing: input only; diagnostic: output only."""

    prognostic: list[str] = Field(min_length=1)
    forcing: list[str] = []
    diagnostic: list[str] = []
    computed_forcing: list[ComputedForcing] = []

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
    per_variable: dict[str, NormalizerName] = {}


class DateWindow(Strict):
    """Inclusive date window; ``None`` means the dataset's first (start) or last (end) date."""

    start: str | None = None
    end: str | None = None


class SplitsConfig(Strict):
    train: DateWindow = DateWindow()
    val: DateWindow = DateWindow()


class DataConfig(Strict):
    dataset: str = Field(description="path to an anemoi-datasets zarr, or 'builtin' for the generated dataset")
    val_dataset: str | None = Field(
        None,
        description="validate on another anemoi-datasets zarr of the same grid (another trajectory or period); "
        "data.splits.val picks its dates, data.dataset's statistics normalise it; null: data.dataset",
    )
    builtin_seed: int = 0
    variables: VariablesConfig
    normalizer: NormalizerConfig = NormalizerConfig()
    splits: SplitsConfig = SplitsConfig()
    timestep: str = Field("6h", description="model time step, a multiple of the data frequency")
    nan_policy: NanPolicy = Field(
        "error", description="NaN/inf in a sample: error names the date and variables; mask leaves them out of the loss"
    )

    @field_validator("timestep")
    @classmethod
    def _timestep_format(cls, v: str) -> str:
        if not _TIMESTEP.match(v):
            raise ValueError("expected a whole number and a unit m, h or d, e.g. '30m', '6h', '1d'")
        return v


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


# ---------------------------------------------------------------------------------------------- graph
class GraphConfig(Strict):
    mesh_resolution: int = Field(4, ge=0, le=9, description="icosahedron refinements: 10*4^r+2 hidden nodes")
    cutoff_factor: float = Field(0.6, gt=0)
    knn: int = Field(3, ge=1)
    cache: bool = True


# ---------------------------------------------------------------------------------------------- model
ShardStrategy = Literal["edges", "heads"]
_SHARD_STRATEGY = (
    "with system.hardware.num_gpus_per_model > 1: edges (each rank owns a block of destination nodes and their "
    "incoming edges) or heads (each rank attends over the whole graph for its share of the heads)"
)


class MapperConfig(Strict):
    num_chunks: int | Literal["auto"] = Field(
        4, description="destination chunks, a power of two; auto: smallest that fits system.hardware.memory_budget_gb"
    )
    shard_strategy: ShardStrategy = Field("edges", description=_SHARD_STRATEGY)
    gradient_checkpointing: bool = True

    @field_validator("num_chunks")
    @classmethod
    def _power_of_two(cls, v: int | str) -> int | str:
        if v != "auto" and not _is_power_of_two(v):
            raise ValueError(f"must be a power of two (1, 2, 4, ...) or 'auto', got {v}")
        return v


class ProcessorConfig(Strict):
    type: Literal["graphtransformer", "transformer"] = "graphtransformer"
    num_layers: int = Field(4, ge=1)
    num_chunks: int | Literal["auto"] = Field(
        2, description="checkpoint segments of consecutive layers (at most num_layers); auto: fit the memory budget"
    )
    gradient_checkpointing: bool = True
    shard_strategy: ShardStrategy = Field(
        "edges", description=_SHARD_STRATEGY + "; the transformer processor shards by heads only (its default)"
    )
    window_size: int = Field(512, ge=1, description="transformer only: half width of the sliding window (nodes)")
    attention_implementation: Literal["flash_attention", "scaled_dot_product_attention", "reference"] = Field(
        "scaled_dot_product_attention",
        description="transformer only: flash_attention (flash-attn on CUDA in fp16/bf16; else falls back to "
        "scaled_dot_product_attention with one log line), scaled_dot_product_attention, or reference",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_chunks_fit_layers(cls, data: object) -> object:
        if isinstance(data, dict) and "num_chunks" not in data and isinstance(data.get("num_layers"), int):
            data = {**data, "num_chunks": max(1, min(2, data["num_layers"]))}
        return data

    @model_validator(mode="before")
    @classmethod
    def _transformer_shards_heads(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("type") == "transformer" and "shard_strategy" not in data:
            data = {**data, "shard_strategy": "heads"}
        return data

    @model_validator(mode="after")
    def _chunks_fit_layers(self) -> ProcessorConfig:
        if self.num_chunks != "auto" and not 1 <= self.num_chunks <= self.num_layers:
            raise ValueError(f"num_chunks ({self.num_chunks}) must be between 1 and num_layers ({self.num_layers})")
        if self.type == "transformer" and self.shard_strategy != "heads":
            raise ValueError("the transformer processor shards by heads: set shard_strategy to heads")
        return self


class TrainableSizes(Strict):
    """Zero-initialised trainable features appended to node and edge inputs."""

    nodes: int = Field(8, ge=0)
    edges: int = Field(8, ge=0)


class CompileEntry(Strict):
    """Compile every submodule of exactly this class in place with ``torch.compile(**options)``."""

    module: str = Field(description="dotted class path, e.g. anemo_like.models.block.GraphTransformerBlock")
    options: dict[str, Any] = Field({}, description="torch.compile keyword arguments (dynamic, mode, fullgraph, ...)")


class ModelConfig(Strict):
    num_channels: int = Field(128, ge=1)
    num_heads: int = Field(8, ge=1)
    mlp_hidden_ratio: float = Field(4.0, gt=0)
    trainable: TrainableSizes = TrainableSizes()
    latent_skip: bool = True
    graph_attention_backend: Literal["torch", "reference", "triton"] = Field(
        "torch", description="torch (any device), reference (plain autograd), triton (fused kernels on CUDA)"
    )
    strict_backends: bool = Field(
        False, description="an attention backend that cannot run here is an error, not a fallback with a log line"
    )
    encoder: MapperConfig = MapperConfig()
    decoder: MapperConfig = MapperConfig()
    processor: ProcessorConfig = ProcessorConfig()
    relu_bounded: list[str] = Field([], description="output variables clamped at zero (e.g. precipitation)")
    compile: list[CompileEntry] = Field([], description="module classes compiled with torch.compile (docs/backends.md)")
    recompile_limit: int = Field(8, ge=1, description="torch._dynamo recompilations allowed per compiled function")
    compile_on_error: Literal["raise", "eager"] = Field(
        "raise", description="raise: a module that fails to compile stops the run; eager: warn and run it uncompiled"
    )

    @model_validator(mode="after")
    def _heads_divide_channels(self) -> ModelConfig:
        if self.num_channels % self.num_heads:
            raise ValueError(f"num_channels ({self.num_channels}) must be divisible by num_heads ({self.num_heads})")
        return self


# ------------------------------------------------------------------------------------------- training
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
    lr_min: float = Field(1e-5, ge=0)
    warmup_steps: int = Field(50, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = Field(0.1, ge=0)
    gradient_clip_norm: float | None = Field(1.0, gt=0)
    lr_scaling: Literal["none", "linear", "sqrt"] = Field(
        "none", description="scale lr (and lr_min) by the number of model instances (linear) or its square root"
    )
    fused: bool = Field(
        True, description="fused AdamW kernels where the device supports them, else foreach (with a log line)"
    )


Precision = Literal["32", "tf32", "bf16-mixed", "16-mixed", "bf16"]


class TrainingConfig(Strict):
    seed: int = 42
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
    rollout: RolloutConfig = RolloutConfig()
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
    optimizer: OptimizerConfig = OptimizerConfig()
    variable_loss_weights: dict[str, float] = {}

    @field_validator("variable_loss_weights")
    @classmethod
    def _weights_usable(cls, weights: dict[str, float]) -> dict[str, float]:
        negative = {k: v for k, v in weights.items() if v < 0}
        if negative:
            raise ValueError(f"weights must be >= 0, got {negative}")
        return weights

    resume: str | None = Field(
        None, description="training checkpoint to continue from; 'auto': the run folder's latest, if any"
    )


# --------------------------------------------------------------------------------------------- system
class HardwareConfig(Strict):
    accelerator: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads; None keeps torch's default")
    memory_budget_gb: float | None = Field(
        None, gt=0, description="memory per model instance for num_chunks: auto; None: 80 % of what the device has"
    )
    release_cpu_heap_mib: float | None = Field(
        32.0, gt=0, description="on CPU, return free heap to the OS once the process grew this much; None: never"
    )
    collective_timeout_minutes: float = Field(
        30.0, gt=0, description="a collective waiting longer fails (a rank died or hangs) instead of hanging"
    )
    num_gpus_per_model: int = Field(
        1,
        ge=1,
        description="ranks (GPUs, or CPU processes) that share one model instance: a power of two dividing the world "
        "size, at most model.num_heads; the rest of the world runs data parallel across instances",
    )
    bucket_cap_mb: float = Field(25.0, gt=0, description="gradient all-reduce bucket size, data parallel")
    broadcast_buffers: bool = Field(True, description="copy rank 0's buffers with its weights at start")


class PathsConfig(Strict):
    output: str = Field(description="run folder for checkpoints, metrics and plots")
    cache: str = Field(description="folder for the built-in dataset and cached graphs")


class SystemConfig(Strict):
    hardware: HardwareConfig = HardwareConfig()
    paths: PathsConfig


class ProfileConfig(Strict):
    """What ``anemo-profile`` runs: warm-up steps, timed steps, then steps under torch.profiler."""

    warmup_steps: int = Field(2, ge=1, description="untimed steps first (first-touch costs, caches)")
    steps: int = Field(5, ge=1, description="steps timed phase by phase, memory sampled")
    profiled_steps: int = Field(2, ge=1, description="steps under torch.profiler: operator tables, trace, timeline")
    loader_batches: int = Field(20, ge=1, description="batches read by the dataloader alone, for its own rate")
    top_operators: int = Field(20, ge=1, description="rows of each operator table")
    output: str | None = Field(None, description="report folder; default: <system.paths.output>/profile")
    all_ranks: bool = Field(False, description="every rank writes a report (rank<N>/); default rank 0 only")


class MemorySnapshotConfig(Strict):
    """Record the allocator's history over a window of training steps (CUDA; CPU falls back to an RSS timeline)."""

    enabled: bool = False
    warmup: int = Field(5, ge=0, description="steps before recording starts")
    steps: int = Field(3, ge=1, description="steps recorded")
    max_entries: int = Field(100_000, ge=1, description="allocator events kept (CUDA)")


class BenchConfig(Strict):
    """What ``anemo-bench`` runs: per mode, untimed warm-up batches then timed ones."""

    warmup_batches: int = Field(3, ge=0, description="untimed batches first (worker start-up, first-touch costs)")
    batches: int = Field(20, ge=1, description="timed batches per mode")
    modes: list[Literal["io", "synthetic", "full"]] = Field(["io", "synthetic", "full"], min_length=1)


class DiagnosticsConfig(Strict):
    log_every_n_steps: int = Field(
        50, ge=1, description="training metrics are read from the device (one host sync) every this many steps"
    )
    progress_bar: bool = True
    plots: bool = True
    plot_variable: str | None = Field(None, description="variable of the forecast map; default: first prognostic")
    profile: ProfileConfig = ProfileConfig()
    memory_snapshot: MemorySnapshotConfig = MemorySnapshotConfig()
    bench: BenchConfig = BenchConfig()


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
        self._check_model_sharding()
        plot = self.diagnostics.plot_variable
        if plot is not None and plot not in outputs:
            raise ValueError(
                f"diagnostics.plot_variable '{plot}' is not an output variable; choose from {sorted(outputs)}"
            )
        return self

    def _check_model_sharding(self) -> None:
        per_model, heads = self.system.hardware.num_gpus_per_model, self.model.num_heads
        if not _is_power_of_two(per_model) or per_model > heads:
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

"""Config sections ``system`` (hardware and paths) and ``diagnostics`` (logging, plots, profiling, benchmarks)."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from anemo_like.config.base import PathText, Strict


# --------------------------------------------------------------------------------------------- system
class HardwareConfig(Strict):
    accelerator: Literal["auto", "cpu", "cuda"] = "auto"
    num_threads: int | None = Field(None, ge=1, description="torch intra-op threads; None keeps torch's default")
    memory_budget_gb: float | None = Field(
        None,
        gt=0,
        description="memory per model instance: the memory plan (num_chunks and gradient_checkpointing auto) fits "
        "it, and set-up refuses ensemble members, batches or a rollout that cannot; None: the plan takes 80 % of what "
        "the device has, the refusals all of it",
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
        description="ranks (GPUs, or CPU processes) that share one model instance: a power of two dividing "
        "model.num_heads (checked with the config) and the world size (checked at launch); the rest of the world "
        "runs data parallel across instances",
    )
    num_gpus_per_ensemble: int = Field(
        1,
        ge=1,
        description="model instances (each num_gpus_per_model ranks) that share the members of one ensemble "
        "(training.ensemble.members, divisible by it); their loss gathers every member",
    )
    bucket_cap_mb: float = Field(25.0, gt=0, description="gradient all-reduce bucket size, data parallel")
    broadcast_buffers: bool = Field(True, description="copy rank 0's buffers with its weights at start")


class PathsConfig(Strict):
    output: PathText = Field(description="run folder for checkpoints, metrics and plots")
    cache: PathText = Field(description="folder for the built-in dataset and cached graphs")


class SystemConfig(Strict):
    hardware: HardwareConfig = HardwareConfig()
    paths: PathsConfig


# ---------------------------------------------------------------------------------------- diagnostics
# MLflow tracking URI schemes: servers, then SQLAlchemy databases (with an optional driver, postgresql+psycopg2)
SERVER_SCHEMES = ("http", "https", "databricks")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")


def check_tracking_uri(uri: str) -> str:
    """``uri`` when MLflow can track to it (a server or a database); else a ValueError saying what is wrong. A
    folder path (MLflow's file store) is refused: MLflow 3 refuses it too."""
    parts = urlsplit(uri)
    scheme = "databricks" if uri == "databricks" else parts.scheme.lower().split("+")[0]
    if not scheme:
        problem = "no scheme"
    elif scheme not in SERVER_SCHEMES + DATABASE_SCHEMES:
        problem = f"unknown scheme '{parts.scheme}'"
    elif scheme in ("http", "https") and not parts.hostname:
        problem = "no host"
    else:
        return uri
    schemes = ", ".join(SERVER_SCHEMES + DATABASE_SCHEMES[:-1])
    raise ValueError(
        f"{problem}; give an MLflow tracking URI of scheme {schemes} or {DATABASE_SCHEMES[-1]}, e.g. "
        "http://host:5000 or sqlite:///path/mlflow.db"
    )


class ProfileConfig(Strict):
    """What ``anemo-profile`` runs: warm-up steps, timed steps, then steps under torch.profiler."""

    warmup_steps: int = Field(2, ge=1, description="untimed steps first (first-touch costs, caches)")
    steps: int = Field(5, ge=1, description="steps timed phase by phase, memory sampled")
    profiled_steps: int = Field(
        2,
        ge=0,
        description="steps under torch.profiler: operator tables, trace, timeline; 0: none (at O320 one step makes "
        "a 500 MB trace and torch needs over 10 GiB to read its events back)",
    )
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


class TrackingConfig(Strict):
    """Experiment tracking: recorded in the run folder first (``tracking/``), sent to the server in the background."""

    backend: Literal["none", "mlflow"] = Field("none", description="none: the run folder only; mlflow: also MLflow")
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI: a server (http, https, databricks) or a database (sqlite, postgresql, "
        "mysql, mssql); None: sqlite:///<parent of the run folder>/mlflow.db (no server)",
    )
    experiment_name: str = Field("anemo_like", min_length=1, description="MLflow experiment (created if missing)")
    run_name: str | None = Field(None, description="MLflow run name; None: the run folder's name")
    tags: dict[str, str] = Field({}, description="extra tags of the MLflow run")
    log_model: bool = Field(False, description="upload inference.pt as an artifact at the end of the run")
    send_every_s: float = Field(5.0, gt=0, description="the background sender sends what is new this often")

    @field_validator("tracking_uri")
    @classmethod
    def _known_scheme(cls, uri: str | None) -> str | None:
        return uri if uri is None else check_tracking_uri(uri)


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
    tracking: TrackingConfig = TrackingConfig()

"""Config sections ``graph`` (the encoder-processor-decoder graph) and ``model`` (the network and its memory knobs).

``num_chunks`` names three different counts, depending on where it is read:

- ``model.encoder.num_chunks`` / ``model.decoder.num_chunks`` (mappers): destination chunks, contiguous blocks of
  destination nodes run, and checkpointed, one after another. With ``shard_strategy: heads`` on several ranks the
  mapper has no destination chunks and the count is instead the minimum number of edge blocks of its attention.
- ``model.processor.num_chunks``: checkpoint segments, groups of consecutive layers recomputed together in backward.
- In eval mode (inference) ``ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER`` replaces the mappers' destination-chunk count and
  ``ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR`` sets the processor's destination chunks: each layer computes keys and
  values once, then runs the rest a chunk of destination nodes at a time; sharded, each layer's edges split into
  at least that many blocks by the ``torch`` attention backend (``ANEMOI_INFERENCE_NUM_CHUNKS`` sets both;
  ``runtime.inference_environment`` reads them).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from anemo_like.config.base import Strict, is_power_of_two

# ---------------------------------------------------------------------------------------------- graph
MAX_MESH_RESOLUTION = 9  # 10*4^9+2 = 2.6 million hidden nodes


def mesh_nodes(resolution: int) -> int:
    """Vertices of the icosahedron refined ``resolution`` times: 10*4^r+2."""
    return 10 * 4**resolution + 2


class IcosahedralHidden(Strict):
    """Hidden nodes: the whole refined icosahedron of ``graph.mesh_resolution``."""

    kind: Literal["icosahedral"] = "icosahedral"


class StretchedHidden(Strict):
    """Hidden nodes: the refinement-level ``global_resolution`` vertices everywhere plus every vertex up to level
    ``region_resolution`` within ``margin_km`` of the dataset's region points (its ``region`` mask); ignores
    graph.mesh_resolution."""

    kind: Literal["stretched"]
    global_resolution: int = Field(ge=0, le=MAX_MESH_RESOLUTION - 1, description="refinements everywhere")
    region_resolution: int = Field(
        ge=1, le=MAX_MESH_RESOLUTION, description="refinements over the region (> global_resolution)"
    )
    margin_km: float = Field(ge=0, description="refined area: within this distance (plus the region's grid spacing)")

    @model_validator(mode="after")
    def _region_finer(self) -> StretchedHidden:
        if self.region_resolution <= self.global_resolution:
            raise ValueError(
                f"region_resolution ({self.region_resolution}) must be greater than global_resolution "
                f"({self.global_resolution}): the region's mesh is the finer one"
            )
        return self


class LimitedAreaHidden(Strict):
    """Hidden nodes: only the refinement-level ``region_resolution`` vertices within ``margin_km`` of the data
    points (a regional grid, all of which is the region); ignores graph.mesh_resolution."""

    kind: Literal["limited_area"]
    region_resolution: int = Field(ge=1, le=MAX_MESH_RESOLUTION, description="refinements of the regional mesh")
    margin_km: float = Field(ge=0, description="mesh area: within this distance (plus the grid spacing) of the data")


HiddenMesh = Annotated[IcosahedralHidden | StretchedHidden | LimitedAreaHidden, Field(discriminator="kind")]


class GraphConfig(Strict):
    mesh_resolution: int = Field(
        4,
        ge=0,
        le=MAX_MESH_RESOLUTION,
        description="icosahedron refinements of graph.hidden kind icosahedral: 10*4^r+2 hidden nodes (stretched and "
        "limited_area ignore it)",
    )
    hidden: HiddenMesh = Field(
        None,  # validated: null is the icosahedral mesh, so a value is always a section with a kind
        validate_default=True,
        description="hidden nodes: null or {kind: icosahedral} (the whole mesh of graph.mesh_resolution), {kind: "
        "stretched, global_resolution, region_resolution, margin_km} (needs a dataset with a region mask) or {kind: "
        "limited_area, region_resolution, margin_km}",
    )
    cutoff_factor: float = Field(0.6, gt=0)
    knn: int = Field(3, ge=1, description="hidden (mesh) nodes the decoder links each grid point to")
    cache: bool = True

    @field_validator("hidden", mode="before")
    @classmethod
    def _null_is_icosahedral(cls, v: object) -> object:
        return IcosahedralHidden() if v is None else v

    @model_validator(mode="after")
    def _knn_fits_the_mesh(self) -> GraphConfig:
        """The fewest hidden nodes the mesh can have: all of them (icosahedral), the global level's (stretched); a
        limited-area mesh's count depends on the data and is checked when the graph is built."""
        if isinstance(self.hidden, LimitedAreaHidden):
            return self
        if isinstance(self.hidden, StretchedHidden):
            key, resolution = "graph.hidden.global_resolution", self.hidden.global_resolution
        else:
            key, resolution = "graph.mesh_resolution", self.mesh_resolution
        hidden = mesh_nodes(resolution)
        if self.knn > hidden:
            raise ValueError(
                f"knn ({self.knn}) is more than the {hidden} hidden (mesh) nodes of {key.split('.')[-1]} "
                f"{resolution}; set graph.knn to at most {hidden} or raise {key}"
            )
        return self


# ---------------------------------------------------------------------------------------------- model
ShardStrategy = Literal["edges", "heads"]
_SHARD_STRATEGY = (
    "with system.hardware.num_gpus_per_model > 1: edges (each rank owns a block of destination nodes and their "
    "incoming edges) or heads (each rank attends over the whole graph for its share of the heads)"
)


class MapperConfig(Strict):
    """A mapper (encoder: grid to hidden nodes, decoder: hidden to grid nodes); num_chunks: destination chunks."""

    num_chunks: int | Literal["auto"] = Field(
        4,
        description="destination chunks: contiguous blocks of destination nodes run (and checkpointed) one after "
        "another, a power of two; with shard_strategy heads on several ranks: the minimum number of edge blocks "
        "instead; auto: smallest that fits system.hardware.memory_budget_gb; in eval mode "
        "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER replaces it",
    )
    shard_strategy: ShardStrategy = Field("edges", description=_SHARD_STRATEGY)
    gradient_checkpointing: bool | Literal["auto"] = Field(
        True,
        description="recompute each chunk in backward instead of keeping its activations; auto: off where the "
        "memory plan fits system.hardware.memory_budget_gb without it (faster), on where it must",
    )

    @field_validator("num_chunks")
    @classmethod
    def _power_of_two(cls, v: int | str) -> int | str:
        if v != "auto" and not is_power_of_two(v):
            raise ValueError(f"must be a power of two (1, 2, 4, ...) or 'auto', got {v}")
        return v


class ProcessorConfig(Strict):
    """The processor over the hidden nodes; num_chunks: checkpoint segments of consecutive layers."""

    type: Literal["graphtransformer", "transformer"] = "graphtransformer"
    num_layers: int = Field(4, ge=1)
    num_chunks: int | Literal["auto"] = Field(
        2,
        description="checkpoint segments: groups of consecutive layers recomputed together in backward (at most "
        "num_layers; default min(2, num_layers)); auto: fit the memory budget. Not an edge split: in eval mode "
        "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR sets destination chunks per layer",
    )
    gradient_checkpointing: bool | Literal["auto"] = Field(
        True,
        description="recompute each segment in backward instead of keeping its activations; auto: off where the "
        "memory plan fits system.hardware.memory_budget_gb without it (faster), on where it must",
    )
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


class NoiseConfig(Strict):
    """Processor noise of an ensemble model: per mesh node, ``channels`` standard normal values, fresh at every
    forward pass, are embedded and scale and shift every processor LayerNorm (docs/ensembles.md)."""

    channels: int = Field(16, ge=1, description="noise values drawn per mesh node")


class ModelConfig(Strict):
    num_channels: int = Field(128, ge=1)
    num_heads: int = Field(8, ge=1)
    mlp_hidden_ratio: float = Field(
        4.0, gt=0, description="MLP hidden width over num_channels (rounded; at least 1 unit: ratio >= 0.5 / channels)"
    )
    trainable: TrainableSizes = TrainableSizes()
    latent_skip: bool = True
    graph_attention_backend: Literal["torch", "reference", "triton"] = Field(
        "torch", description="torch (any device), reference (plain autograd), triton (fused kernels on CUDA)"
    )
    strict_backends: bool = Field(
        False, description="an attention backend that cannot run here is an error, not a fallback with a log line"
    )
    block_elements: int | Literal["auto"] = Field(
        "auto",
        description="elements of one scratch block: the torch attention backend's per-edge tensors and the MLP's "
        "hidden layer are made a block at a time (a power of two). Fewer, larger blocks dispatch "
        "fewer operators (kernel launches on a GPU) and hold more memory; auto: 2^18 on CPU (cache-sized), 2^24 "
        "on a GPU",
    )
    encoder: MapperConfig = MapperConfig()
    decoder: MapperConfig = MapperConfig()
    processor: ProcessorConfig = ProcessorConfig()
    noise: NoiseConfig | None = Field(
        None, description="processor noise for ensemble members (training.ensemble); null: a deterministic model"
    )
    relu_bounded: list[str] = Field([], description="output variables clamped at zero (e.g. precipitation)")
    compile: list[CompileEntry] = Field([], description="module classes compiled with torch.compile (docs/backends.md)")
    recompile_limit: int = Field(8, ge=1, description="torch._dynamo recompilations allowed per compiled function")
    compile_on_error: Literal["raise", "eager"] = Field(
        "raise", description="raise: a module that fails to compile stops the run; eager: warn and run it uncompiled"
    )

    @field_validator("block_elements")
    @classmethod
    def _block_power_of_two(cls, v: int | str) -> int | str:
        if v != "auto" and not is_power_of_two(v):
            raise ValueError(f"must be a power of two (262144, 16777216, ...) or 'auto', got {v}")
        return v

    @property
    def resolved_block_elements(self) -> int | None:
        """``block_elements`` for the model's kernels: None for auto (each kernel picks its device's default)."""
        return None if self.block_elements == "auto" else self.block_elements

    @model_validator(mode="after")
    def _heads_divide_channels(self) -> ModelConfig:
        if self.num_channels % self.num_heads:
            raise ValueError(f"num_channels ({self.num_channels}) must be divisible by num_heads ({self.num_heads})")
        return self

    @model_validator(mode="after")
    def _mlp_hidden_layer_not_empty(self) -> ModelConfig:
        """Every other width is at least 1 by the field bounds (head width: num_channels / num_heads; edge and node
        features: fixed attributes plus trainable ones); the MLP hidden width is rounded from a float."""
        channels, ratio = self.num_channels, self.mlp_hidden_ratio
        hidden = int(channels * ratio + 0.5)  # as models/block.py and models/sliding_window.py size it
        if hidden < 1:
            smallest = math.ceil(5e5 / channels) / 1e6  # 0.5 / num_channels, rounded up to 6 decimals
            raise ValueError(
                f"mlp_hidden_ratio ({ratio}) leaves the MLP hidden layer empty: int(num_channels ({channels}) * "
                f"{ratio} + 0.5) = {hidden} units; raise mlp_hidden_ratio to at least {smallest:g}"
            )
        return self

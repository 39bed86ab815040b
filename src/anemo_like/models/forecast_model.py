"""Encoder-processor-decoder forecast model: data grid -> mesh -> processor -> mesh -> data grid."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig
from anemo_like.data.variables import VariableLayout
from anemo_like.models.imputer import Imputer
from anemo_like.models.mapper import GraphTransformerMapper
from anemo_like.models.node_features import NodeFeatures
from anemo_like.models.noise import NoiseEmbedding
from anemo_like.models.ops.collectives import gather_nodes
from anemo_like.models.processor import GraphTransformerProcessor, TransformerProcessor
from anemo_like.models.sharding import ModelShard

ENCODER_EDGES = ("data", "to", "hidden")
PROCESSOR_EDGES = ("hidden", "to", "hidden")
DECODER_EDGES = ("hidden", "to", "data")


def _check_chunks_resolved(config: ModelConfig) -> None:
    unresolved = [
        f"{name}.{key}"
        for name in ("encoder", "processor", "decoder")
        for key in ("num_chunks", "gradient_checkpointing")
        if getattr(getattr(config, name), key) == "auto"
    ]
    if unresolved:
        raise ValueError(f"{unresolved} is 'auto': resolve it first (runtime.memory_plan.resolve_auto_settings)")


class ForecastModel(nn.Module):
    """Maps ``multistep`` normalised past states to the next ``output_steps`` normalised states.

    Input (B, T, G, V_in) -> output (B, G, V_out), or (B, K, G, V_out) for K = ``output_steps`` > 1. The last input
    state is added to the prognostic outputs (of every one of the K states), so the network predicts the change of
    prognostic variables since the last input state and the value of diagnostic ones.

    A limited-area model (``layout.boundary_inputs``) also reads, at every grid point, the forced prognostic values of
    the K states it predicts (zero in the interior) and the boundary mask: it knows what flows in while it steps.

    Sharded over a model group (:func:`anemo_like.distributed.parallelize.shard_model`), every rank takes the
    whole input, computes its blocks of hidden and grid nodes, and returns the whole output (gathered).
    """

    def __init__(
        self, *, config: ModelConfig, graph: HeteroData, layout: VariableLayout, multistep: int, output_steps: int = 1
    ) -> None:
        """``graph``: data and hidden nodes (``x``: latitude and longitude in radians) and the encoder, decoder and
        (graph-transformer processor) hidden->hidden edges; ``multistep`` past states of ``layout.num_input``
        variables in, ``output_steps`` states of ``layout.num_output`` out (the decoder head predicts
        ``output_steps * layout.num_output`` values per grid point). Every ``num_chunks`` must be resolved (no
        ``auto``)."""
        super().__init__()
        _check_chunks_resolved(config)
        self.layout = layout
        self.output_steps = output_steps
        self.shard = ModelShard()
        self.latent_skip = config.latent_skip
        self.data_features = NodeFeatures(latlon_rad=graph["data"].x, trainable_size=config.trainable.nodes)
        self.hidden_features = NodeFeatures(latlon_rad=graph["hidden"].x, trainable_size=config.trainable.nodes)
        self.boundary_channels = output_steps * len(layout.prognostic_output) + 1 if layout.boundary_inputs else 0
        data_in = multistep * layout.num_input + self.boundary_channels + self.data_features.num_features
        self.encoder = GraphTransformerMapper.from_config(
            config=config,
            section=config.encoder,
            graph=graph,
            edge_type=ENCODER_EDGES,
            src_in_channels=data_in,
            dst_in_channels=self.hidden_features.num_features,
            sources_sharded=False,
        )
        self.processor: GraphTransformerProcessor | TransformerProcessor
        if config.processor.type == "graphtransformer":
            self.processor = GraphTransformerProcessor.from_config(
                config=config, graph=graph, edge_type=PROCESSOR_EDGES
            )
        else:
            self.processor = TransformerProcessor.from_config(config=config, num_nodes=graph["hidden"].num_nodes)
        self.decoder = GraphTransformerMapper.from_config(
            config=config,
            section=config.decoder,
            graph=graph,
            edge_type=DECODER_EDGES,
            dst_in_channels=data_in,
            out_channels=output_steps * layout.num_output,
            sources_sharded=True,
        )
        here = graph["data"].x.device  # the layout's buffers beside the graph's, also when built on the meta device
        self.register_buffer("prognostic_input", torch.tensor(layout.prognostic_input, dtype=torch.long, device=here))
        self.register_buffer("prognostic_output", torch.tensor(layout.prognostic_output, dtype=torch.long, device=here))
        floor = torch.full((layout.num_output,), -torch.inf, device=here)
        for index, value in layout.relu_floor.items():
            floor[index] = value
        # derived from the layout, which checkpoints store: not saved (its -inf would read as a diverged weight)
        self.register_buffer("output_floor", floor if layout.relu_floor else None, persistent=False)
        self.imputer = (
            Imputer(imputed=layout.imputed, restored=layout.restored, device=here) if layout.imputed else None
        )
        self.num_hidden = graph["hidden"].num_nodes
        self.noise_embedding = None
        if config.noise is not None:
            self.noise_embedding = NoiseEmbedding(noise_channels=config.noise.channels, channels=config.num_channels)

    def noise_shape(self, batch: int) -> tuple[int, int, int] | None:
        """(B, N_hidden, D): the processor noise one forward pass of ``batch`` states reads; None: deterministic."""
        if self.noise_embedding is None:
            return None
        return batch, self.num_hidden, self.noise_embedding.noise_channels

    def _noise_conditioning(self, noise: Tensor | None, batch: int, like: Tensor) -> Tensor | None:
        """This rank's block of the embedded noise, (B, n, C); None for a deterministic model. Without ``noise``
        it is drawn from torch's global generator (diagnostics; training and inference pass their own)."""
        if self.noise_embedding is None:
            return None
        shape = self.noise_shape(batch)
        if noise is None:
            noise = torch.randn(shape, device=like.device)
        if tuple(noise.shape) != shape:
            raise ValueError(f"the processor noise has shape {tuple(noise.shape)}, the model reads {shape}")
        return self.noise_embedding(noise[:, slice(*self.shard.block(self.num_hidden))].to(like.dtype))

    def forward(self, x: Tensor, noise: Tensor | None = None, boundary: Tensor | None = None) -> Tensor:
        """x: (B, T, G, V_in) normalised -> (B, G, V_out), or (B, K, G, V_out) for K = ``output_steps`` > 1,
        normalised, in x's dtype (also under autocast: the network's output, in the autocast dtype, is added to the
        last state in full precision). ``noise`` (B, N_hidden, D), standard normal: the processor noise of an
        ensemble model (``model.noise``; ignored by a deterministic one). ``boundary`` (B, G, K * V_prognostic + 1):
        a limited-area model's forced values of the predicted states and the boundary mask
        (:func:`~anemo_like.models.rollout.boundary_inputs`); required by it, refused by any other model. A model
        with an imputer (``layout.imputed``) takes NaN in those inputs and gives NaN back where they were missing."""
        batch, _, grid, _ = x.shape
        missing = None
        if self.imputer is not None:
            x, missing = self.imputer.fill(x)
        known = [x.transpose(1, 2).reshape(batch, grid, -1), *self._boundary(boundary, x), self.data_features(batch)]
        x_data = torch.cat(known, dim=-1)
        hidden = self.hidden_features(batch)
        latent = self.encoder(x_data, hidden[:, slice(*self.shard.block(hidden.shape[1]))])
        cond = self._noise_conditioning(noise, batch, x)
        processed = self.processor(latent) if cond is None else self.processor(latent, cond)
        if self.latent_skip:
            processed = processed + latent
        out = self.decoder(processed, x_data[:, slice(*self.shard.block(grid))])
        out = gather_nodes(out, self.shard.group, self.shard.sizes(grid))
        residual = x[:, -1].index_select(-1, self.prognostic_input)
        if self.output_steps > 1:  # (B, G, K * V_out) -> (B, K, G, V_out), each state a change from the last input
            out = out.unflatten(-1, (self.output_steps, -1)).transpose(1, 2)
            residual = residual.unsqueeze(1).expand(-1, self.output_steps, -1, -1)
        out = out.to(x.dtype).index_add(-1, self.prognostic_output, residual)  # fp32 under autocast
        if self.output_floor is not None:
            out = torch.maximum(out, self.output_floor.to(out.dtype))
        return out if missing is None else self.imputer.restore(out, missing)

    def _boundary(self, boundary: Tensor | None, x: Tensor) -> list[Tensor]:
        """``boundary`` in x's dtype as a list of the extra input blocks (empty for a model that reads none)."""
        if (boundary is None) != (self.boundary_channels == 0):
            raise ValueError(
                f"this model reads {self.boundary_channels} boundary channels, got "
                f"{'none' if boundary is None else tuple(boundary.shape)}: a limited-area model needs boundary="
            )
        if boundary is None:
            return []
        if boundary.shape[-1] != self.boundary_channels:
            raise ValueError(f"boundary has {boundary.shape[-1]} channels, the model reads {self.boundary_channels}")
        return [boundary.to(x.dtype)]

"""Encoder-processor-decoder forecast model: data grid -> mesh -> processor -> mesh -> data grid."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch_geometric.data import HeteroData

from anemo_like.config.schema import ModelConfig
from anemo_like.distributed.primitives import gather_nodes
from anemo_like.models.mapper import GraphTransformerMapper
from anemo_like.models.node_features import NodeFeatures
from anemo_like.models.processor import GraphTransformerProcessor, TransformerProcessor
from anemo_like.models.sharding import ModelShard

ENCODER_EDGES = ("data", "to", "hidden")
PROCESSOR_EDGES = ("hidden", "to", "hidden")
DECODER_EDGES = ("hidden", "to", "data")


@dataclass(frozen=True)
class VariableLayout:
    """How variables enter and leave the model (indices into the model's input / output variable axis)."""

    num_input: int
    num_output: int
    prognostic_input: list[int]  # input positions of the prognostic variables ...
    prognostic_output: list[int]  # ... and their output positions, in the same order
    relu_floor: dict[int, float]  # output position -> normalised value of physical zero


class ForecastModel(nn.Module):
    """Maps ``multistep`` normalised past states to the next normalised state.

    Input (B, T, G, V_in) -> output (B, G, V_out). The last input state is added to the prognostic outputs, so
    the network predicts the tendency of prognostic variables and the value of diagnostic ones.

    Sharded over a model group (:func:`anemo_like.distributed.parallelize.shard_model`), every rank takes the
    whole input, computes its blocks of hidden and grid nodes, and returns the whole output (gathered).
    """

    def __init__(self, *, config: ModelConfig, graph: HeteroData, layout: VariableLayout, multistep: int) -> None:
        super().__init__()
        unresolved = [n for n in ("encoder", "processor", "decoder") if getattr(config, n).num_chunks == "auto"]
        if unresolved:
            raise ValueError(
                f"num_chunks of {unresolved} is 'auto': resolve it first (models.memory_model.resolve_auto_chunks)"
            )
        self.layout = layout
        self.shard = ModelShard()
        self.latent_skip = config.latent_skip
        channels, heads, ratio = config.num_channels, config.num_heads, config.mlp_hidden_ratio
        backend = config.graph_attention_backend
        num_data, num_hidden = graph["data"].num_nodes, graph["hidden"].num_nodes
        self.data_features = NodeFeatures(latlon_rad=graph["data"].x, trainable_size=config.trainable.nodes)
        self.hidden_features = NodeFeatures(latlon_rad=graph["hidden"].x, trainable_size=config.trainable.nodes)
        data_in = multistep * layout.num_input + self.data_features.num_features

        def mapper(edges: tuple[str, str, str], num_dst: int, **kwargs: object) -> GraphTransformerMapper:
            store = graph[edges]
            return GraphTransformerMapper(
                channels=channels,
                edge_attr=store.edge_attr,
                edge_index=store.edge_index,
                num_src=graph[edges[0]].num_nodes,
                num_dst=num_dst,
                trainable_edge_size=config.trainable.edges,
                num_heads=heads,
                mlp_hidden_ratio=ratio,
                backend=backend,
                **kwargs,
            )

        self.encoder = mapper(
            ENCODER_EDGES,
            num_hidden,
            src_in_channels=data_in,
            dst_in_channels=self.hidden_features.num_features,
            out_channels=None,
            sources_sharded=False,
            num_chunks=config.encoder.num_chunks,
            gradient_checkpointing=config.encoder.gradient_checkpointing,
            shard_strategy=config.encoder.shard_strategy,
        )
        if config.processor.type == "graphtransformer":
            if PROCESSOR_EDGES not in graph.edge_types:
                raise ValueError("the graphtransformer processor needs hidden->hidden edges, but the graph has none")
            self.processor = GraphTransformerProcessor(
                channels=channels,
                num_nodes=num_hidden,
                edge_attr=graph[PROCESSOR_EDGES].edge_attr,
                edge_index=graph[PROCESSOR_EDGES].edge_index,
                trainable_edge_size=config.trainable.edges,
                num_layers=config.processor.num_layers,
                num_chunks=config.processor.num_chunks,
                num_heads=heads,
                mlp_hidden_ratio=ratio,
                gradient_checkpointing=config.processor.gradient_checkpointing,
                backend=backend,
                shard_strategy=config.processor.shard_strategy,
            )
        else:
            self.processor = TransformerProcessor(
                channels=channels,
                num_nodes=num_hidden,
                num_layers=config.processor.num_layers,
                num_chunks=config.processor.num_chunks,
                num_heads=heads,
                mlp_hidden_ratio=ratio,
                window_size=config.processor.window_size,
                attention_implementation=config.processor.attention_implementation,
                gradient_checkpointing=config.processor.gradient_checkpointing,
            )
        self.decoder = mapper(
            DECODER_EDGES,
            num_data,
            src_in_channels=None,
            dst_in_channels=data_in,
            out_channels=layout.num_output,
            sources_sharded=True,
            num_chunks=config.decoder.num_chunks,
            gradient_checkpointing=config.decoder.gradient_checkpointing,
            shard_strategy=config.decoder.shard_strategy,
        )
        self.register_buffer("prognostic_input", torch.tensor(layout.prognostic_input, dtype=torch.long))
        self.register_buffer("prognostic_output", torch.tensor(layout.prognostic_output, dtype=torch.long))
        floor = torch.full((layout.num_output,), -torch.inf)
        for index, value in layout.relu_floor.items():
            floor[index] = value
        self.register_buffer("output_floor", floor if layout.relu_floor else None)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, G, V_in) normalised -> (B, G, V_out) normalised, in x's dtype (also under autocast: the
        network's output, in the autocast dtype, is added to the last state in full precision)."""
        batch, _, grid, _ = x.shape
        x_data = torch.cat([x.transpose(1, 2).reshape(batch, grid, -1), self.data_features(batch)], dim=-1)
        hidden = self.hidden_features(batch)
        latent = self.encoder(x_data, hidden[:, slice(*self.shard.block(hidden.shape[1]))])
        processed = self.processor(latent)
        if self.latent_skip:
            processed = processed + latent
        out = self.decoder(processed, x_data[:, slice(*self.shard.block(grid))])
        out = gather_nodes(out, self.shard.group, self.shard.sizes(grid))
        residual = x[:, -1].index_select(-1, self.prognostic_input)
        out = out.to(x.dtype).index_add(-1, self.prognostic_output, residual)  # fp32 under autocast
        if self.output_floor is not None:
            out = torch.maximum(out, self.output_floor.to(out.dtype))
        return out

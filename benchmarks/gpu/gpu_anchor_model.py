"""The anchor's model: ``AnemoiModelEncProcDec`` configured as ``../shared/bench/anchor/run.py`` builds it
(anemoi-training's ``model/graphtransformer.yaml`` or ``transformer.yaml``), its sizes from ``gpu_anchor.py``'s
arguments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.gpu.gpu_anchor_setup import EDGE_ATTRIBUTES


def model_config(args: argparse.Namespace) -> Any:
    """Full training-style config as run.py builds it (anemoi-training 0.17.1 model/graphtransformer.yaml or
    model/transformer.yaml with sizes from the arguments)."""
    from omegaconf import OmegaConf

    checkpointing = not args.no_grad_checkpointing
    layer_kernels = {
        "LayerNorm": {"_target_": "torch.nn.LayerNorm"},
        "Linear": {"_target_": "torch.nn.Linear"},
        "Activation": {"_target_": "torch.nn.GELU"},
        "QueryNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
        "KeyNorm": {"_target_": "anemoi.models.layers.normalization.AutocastLayerNorm", "bias": False},
    }
    common_gt = {
        "num_channels": args.channels,
        "sub_graph_edge_attributes": list(EDGE_ATTRIBUTES),
        "mlp_hidden_ratio": args.mlp_hidden_ratio,
        "mlp_implementation": "mlp",
        "num_heads": args.heads,
        "qk_norm": False,
        "cpu_offload": False,
        "gradient_checkpointing": checkpointing,
        "layer_kernels": layer_kernels,
        "shard_strategy": "edges",
        "graph_attention_backend": args.backend,
        "edge_pre_mlp": False,
    }
    if args.processor == "graphtransformer":
        processor = {
            "_target_": "anemoi.models.layers.processor.GraphTransformerProcessor",
            **common_gt,
            "trainable_size": args.edge_trainable,
            "num_layers": args.layers,
            "num_chunks": args.num_chunks_processor,
        }
    else:
        processor = {
            "_target_": "anemoi.models.layers.processor.TransformerProcessor",
            "num_channels": args.channels,
            "num_layers": args.layers,
            "num_chunks": args.num_chunks_processor,
            "mlp_hidden_ratio": args.mlp_hidden_ratio,
            "mlp_implementation": "mlp",
            "num_heads": args.heads,
            "window_size": args.window_size,
            "dropout_p": 0.0,
            "attention_implementation": args.attention_implementation,
            "qk_norm": False,
            "softcap": 0.0,
            "use_alibi_slopes": False,
            "cpu_offload": False,
            "gradient_checkpointing": checkpointing,
            "use_rotary_embeddings": False,
            "layer_kernels": layer_kernels,
        }
    mapper = {**common_gt, "trainable_size": args.edge_trainable, "num_chunks": args.num_chunks_mapper}
    cfg = {
        "model": {
            "num_channels": args.channels,
            "cpu_offload": False,
            "keep_batch_sharded": True,
            "model": {
                "_target_": "anemoi.models.models.AnemoiModelEncProcDec",
                "hidden_nodes_name": "hidden",
                "latent_skip": True,
            },
            "layer_kernels": layer_kernels,
            "processor": processor,
            "encoders": {
                "0": {
                    "source_datasets": ["data"],
                    "dataset_fusing_strategy": "not_supported",
                    "mapper": {"_target_": "anemoi.models.layers.mapper.GraphTransformerForwardMapper", **mapper},
                }
            },
            "latent_aggregator": {"_target_": "anemoi.models.layers.aggregator.SumAggregator"},
            "decoders": {
                "0": {
                    "target_datasets": ["data"],
                    "target_node_features": ["encoded_data"],
                    "mapper": {
                        "_target_": "anemoi.models.layers.mapper.GraphTransformerBackwardMapper",
                        **mapper,
                        "initialise_data_extractor_zero": False,
                    },
                }
            },
            "residual": {
                "datasets": {"data": {"_target_": "anemoi.models.layers.residual.SkipConnection", "step": -1}}
            },
            "node_trainable_parameters": {"data": args.node_trainable, "hidden": args.node_trainable},
            "edge_trainable_parameters": {
                "data2hidden": args.edge_trainable,
                "hidden2hidden": args.edge_trainable,
                "hidden2data": args.edge_trainable,
            },
            "attributes": {"edges": list(EDGE_ATTRIBUTES), "nodes": []},
            "bounding": {
                "datasets": {
                    "data": [{"_target_": "anemoi.models.layers.bounding.ReluBounding", "variables": ["tp"]}],
                }
            },
        }
    }
    return OmegaConf.create(cfg)


def build_model(args: argparse.Namespace, graph: Any) -> tuple[Any, Any]:
    """``AnemoiModelEncProcDec`` with all variables prognostic (the first one is ``tp``, bounded by ReluBounding)."""
    import numpy as np
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.models import AnemoiModelEncProcDec
    from omegaconf import OmegaConf

    names = ["tp"] + [f"var_{i}" for i in range(1, args.num_vars)]
    name_to_index = {n: i for i, n in enumerate(names)}
    data_indices = {"data": IndexCollection(OmegaConf.create({"forcing": [], "diagnostic": []}), name_to_index)}
    nv = len(names)
    stats = {
        "data": {
            "mean": np.zeros(nv, dtype=np.float32),
            "stdev": np.ones(nv, dtype=np.float32),
            "minimum": -np.ones(nv, dtype=np.float32),
            "maximum": np.ones(nv, dtype=np.float32),
        }
    }
    model = AnemoiModelEncProcDec(
        model_config=model_config(args),
        data_indices=data_indices,
        statistics=stats,
        n_step_input=args.multistep,
        n_step_output=args.n_step_output,
        graph_data=graph,
    )
    return model, data_indices


def attention_backends(model: Any) -> dict[str, list[str]]:
    """The graph-attention backend each GraphTransformer block ended up with, and the transformer attention class."""
    gt = sorted({m.graph_attention_backend for m in model.modules() if hasattr(m, "graph_attention_backend")})
    tr = sorted(
        {
            type(m.attention).__name__
            for m in model.modules()
            if hasattr(m, "attention_implementation") and hasattr(m, "attention")
        }
    )
    return {"graph_attention_backend": gt, "transformer_attention": tr}

#!/usr/bin/env python3
"""GPU step time and memory of the anchor (ECMWF anemoi-models 0.19.0) at cases S, R, T and O96.

The GPU machine has torch, triton and torch-geometric but neither network access nor anemoi-graphs (which would drag
in anemoi-datasets, netCDF4, eccodes ...). So the work is split in three modes:

    # here, once (any Python with pip; needs network): the wheels anemoi-models needs at model-construction time
    python benchmarks/gpu_anchor.py --download-wheels .gpu-wheels/anchor
    # here, once (the CPU anchor venv, which has anemoi-graphs): the anchor's graphs as plain tensors
    /tmp/anchor/venv/bin/python benchmarks/gpu_anchor.py --build-graphs .gpu-wheels/anchor_graphs
    # there (repo root, GPU machine, Python 3.12): install the wheels, then one JSON line per run
    pip install --no-index --no-deps --target /tmp/site .gpu-wheels/anchor/*.whl
    PYTHONPATH=/tmp/site python3 benchmarks/gpu_anchor.py --case R --precision bf16-mixed --backend triton

The graphs are built with anemoi-graphs following ``../shared/bench/anchor/run.py`` (data nodes on a cell-centred
lat/lon grid, TriNodes hidden mesh, CutOffEdges 0.6 encoder, MultiScaleEdges processor, KNN-3 decoder, EdgeLength +
EdgeDirection ``unit-std`` attributes) and stored as a dict of tensors (no HeteroData pickle, so the torch-geometric
version does not matter). The default mode rebuilds a ``HeteroData`` from them, instantiates
``anemoi.models.models.AnemoiModelEncProcDec`` with the config of run.py (anemoi-training's
``model/graphtransformer.yaml`` / ``transformer.yaml``) and times forward + backward of an MSE loss on random inputs,
batch 1, no optimizer step. On CUDA each phase is timed with CUDA events; memory is
``torch.cuda.max_memory_allocated`` over warm-up and timed steps. ``--device cpu`` is a dry run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from step_measures import profile_summary  # benchmarks/step_measures.py

REPO = Path(__file__).resolve().parents[1]
WHEELS_LIST = Path(__file__).resolve().with_name("gpu_anchor_wheels.txt")
GRAPH_FORMAT = "gpu_anchor_graph/1"

CASES: dict[str, dict[str, Any]] = {
    # same flags as benchmarks/compare_anchor.py (S, R, T); O96: an O96-sized grid (40320 points), mesh res 5
    "S": {"grid": "32x64", "mesh_res": 3, "channels": 128, "layers": 4, "processor": "graphtransformer"},
    "R": {"grid": "96x192", "mesh_res": 4, "channels": 256, "layers": 8, "processor": "graphtransformer"},
    "T": {"grid": "96x192", "mesh_res": 4, "channels": 256, "layers": 8, "processor": "transformer"},
    "O96": {"grid": "144x280", "mesh_res": 5, "channels": 256, "layers": 8, "processor": "graphtransformer"},
    # anemoi's default model (1024 channels, 16 layers, processor chunks 2) on O96's graph, 100 variables, AdamW
    "D": {
        "graph": "O96",
        "channels": 1024,
        "layers": 16,
        "processor": "graphtransformer",
        "num_vars": 100,
        "num_chunks_processor": 2,
        "optim": "adamw",
    },
}
"""Per case: graph recipe (grid, mesh_res, processor; or ``graph``: the case whose graph it shares) and model size;
heads 16 and multistep 2 for all, 8 variables, 4 processor chunks and no optimiser step unless the case says."""

# graph recipe of run.py (anemoi-training config/graph/multi_scale.yaml)
CUTOFF_FACTOR = 0.6
KNN = 3
X_HOPS = 1
EDGE_ATTRIBUTES = ("edge_length", "edge_dirs")

PIP_PLATFORM_FLAGS = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    "--abi",
    "cp312",
    "--abi",
    "abi3",
    "--abi",
    "none",
    "--platform",
    "manylinux_2_28_x86_64",
    "--platform",
    "manylinux_2_17_x86_64",
    "--platform",
    "manylinux2014_x86_64",
    "--platform",
    "any",
]


# ----------------------------------------------------------------------------------------------------------------
# --download-wheels
# ----------------------------------------------------------------------------------------------------------------
def read_wheel_list(path: Path = WHEELS_LIST) -> list[str]:
    """The ``name==version`` lines of gpu_anchor_wheels.txt (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def have_wheel(directory: Path, requirement: str) -> bool:
    """Whether ``directory`` already holds a wheel for ``name==version`` (names compared normalised)."""
    name, version = requirement.split("==")
    norm = name.lower().replace("-", "_").replace(".", "_")
    for wheel in directory.glob("*.whl"):
        parts = wheel.name.split("-")
        if parts[0].lower().replace(".", "_") == norm and parts[1] == version:
            return True
    return False


def download_wheels(directory: Path) -> None:
    """Fetch every wheel of gpu_anchor_wheels.txt for CPython 3.12 / manylinux x86_64 into ``directory``.

    Binary wheels come from ``pip download``; a package published only as an sdist (antlr4-python3-runtime 4.9.3)
    is built into a pure-Python wheel with ``pip wheel --no-deps``. Wheels already present are skipped.
    """
    directory.mkdir(parents=True, exist_ok=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    for requirement in read_wheel_list():
        if have_wheel(directory, requirement):
            continue
        cmd = [*pip, "download", "--no-deps", *PIP_PLATFORM_FLAGS, "-d", str(directory), requirement]
        if subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode != 0:
            print(f"no wheel for {requirement}: building one from the sdist", file=sys.stderr)
            subprocess.run([*pip, "wheel", "--no-deps", "-w", str(directory), requirement], check=True)
    missing = [r for r in read_wheel_list() if not have_wheel(directory, r)]
    if missing:
        raise SystemExit(f"missing wheels in {directory}: {missing}")
    wheels = sorted(directory.glob("*.whl"))
    total = sum(w.stat().st_size for w in wheels)
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**10:9.1f} KiB  {wheel.name}")
    print(f"{len(wheels)} wheels, {total / 2**20:.2f} MiB in {directory}")


# ----------------------------------------------------------------------------------------------------------------
# --build-graphs (needs anemoi-graphs: the CPU anchor venv)
# ----------------------------------------------------------------------------------------------------------------
def data_coordinates(grid: str) -> tuple[Any, Any]:
    """(lat, lon) in degrees of a cell-centred NLATxNLON regular grid (no duplicated poles), as run.py."""
    import numpy as np

    nlat, nlon = (int(v) for v in grid.lower().split("x"))
    lats = -90.0 + (np.arange(nlat) + 0.5) * 180.0 / nlat
    lons = np.arange(nlon) * 360.0 / nlon
    lat2, lon2 = np.meshgrid(lats, lons, indexing="ij")
    return lat2.ravel(), lon2.ravel()


def build_anemoi_graph(grid: str, mesh_res: int, processor: str) -> Any:
    """The anchor's HeteroData, built with anemoi-graphs exactly as run.py's ``build_graph`` (area weights on)."""
    from anemoi.graphs.create import GraphCreator
    from anemoi.graphs.nodes import LatLonNodes
    from anemoi.utils.config import DotDict
    from torch_geometric.data import HeteroData

    lat, lon = data_coordinates(grid)
    node_attrs = {
        "area_weight": {
            "_target_": "anemoi.graphs.nodes.attributes.SphericalAreaWeights",
            "norm": "unit-max",
            "fill_value": 0,
        }
    }
    edge_attrs = {
        "edge_length": {"_target_": "anemoi.graphs.edges.attributes.EdgeLength", "norm": "unit-std"},
        "edge_dirs": {"_target_": "anemoi.graphs.edges.attributes.EdgeDirection", "norm": "unit-std"},
    }
    no_masks = {"source_mask_attr_name": None, "target_mask_attr_name": None}
    graph = LatLonNodes(latitudes=lat, longitudes=lon, name="data").update_graph(
        HeteroData(), attrs_config=DotDict(node_attrs)
    )
    edges = [
        {
            "source_name": "data",
            "target_name": "hidden",
            "edge_builders": [
                {"_target_": "anemoi.graphs.edges.CutOffEdges", "cutoff_factor": CUTOFF_FACTOR, **no_masks}
            ],
            "attributes": edge_attrs,
        },
        {
            "source_name": "hidden",
            "target_name": "hidden",
            "edge_builders": [
                {
                    "_target_": "anemoi.graphs.edges.MultiScaleEdges",
                    "x_hops": X_HOPS,
                    "scale_resolutions": mesh_res,
                    **no_masks,
                }
            ],
            "attributes": edge_attrs,
        },
        {
            "source_name": "hidden",
            "target_name": "data",
            "edge_builders": [{"_target_": "anemoi.graphs.edges.KNNEdges", "num_nearest_neighbours": KNN, **no_masks}],
            "attributes": edge_attrs,
        },
    ]
    if processor == "transformer":  # graph/encoder_decoder_only.yaml: no hidden->hidden edges
        edges = [e for e in edges if e["source_name"] != e["target_name"]]
    config = DotDict(
        {
            "nodes": {"hidden": {"node_builder": {"_target_": "anemoi.graphs.nodes.TriNodes", "resolution": mesh_res}}},
            "edges": edges,
            "post_processors": [],
        }
    )
    creator = GraphCreator(config=config)
    graph = creator.update_graph(graph)
    graph = creator.clean(graph)
    return creator.post_process(graph)


def graph_to_tensors(graph: Any, recipe: dict[str, Any]) -> dict[str, Any]:
    """Plain-tensor form of the HeteroData: what the model reads (node ``x``, ``edge_index``, edge attributes).

    Dtypes are kept as anemoi-graphs made them (x, attributes float32; edge_index int32). The data nodes'
    ``area_weight`` is dropped: the model does not read it.
    """
    nodes = {name: {"x": store["x"].contiguous()} for name, store in graph.node_items()}
    edges = {}
    for (src, _, dst), store in graph.edge_items():
        edges[f"{src}->{dst}"] = {
            "src": src,
            "dst": dst,
            "edge_index": store["edge_index"].contiguous(),
            **{key: store[key].contiguous() for key in EDGE_ATTRIBUTES},
        }
    return {"format": GRAPH_FORMAT, "recipe": recipe, "nodes": nodes, "edges": edges}


def build_graphs(directory: Path, cases: list[str]) -> None:
    """Build and save each case's graph as ``DIR/<case>.pt``; prints sizes."""
    import anemoi.graphs
    import torch

    logging.getLogger("anemoi.graphs").setLevel(logging.ERROR)  # torch-cluster advice, once per edge set
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    for case in (c for c in cases if "graph" not in CASES[c]):  # a shared graph is built under its own case
        spec = CASES[case]
        recipe = {
            "grid": spec["grid"],
            "mesh_res": spec["mesh_res"],
            "processor_edges": spec["processor"] == "graphtransformer",
            "cutoff_factor": CUTOFF_FACTOR,
            "knn": KNN,
            "x_hops": X_HOPS,
            "anemoi_graphs": anemoi.graphs.__version__,
        }
        t0 = time.perf_counter()
        graph = build_anemoi_graph(spec["grid"], spec["mesh_res"], spec["processor"])
        path = directory / f"{case}.pt"
        tensors = graph_to_tensors(graph, recipe)
        torch.save(tensors, path)
        size = path.stat().st_size
        total += size
        seconds = time.perf_counter() - t0
        print(f"{case}: {json.dumps(summary_from_tensors(tensors))} {size / 2**20:.2f} MiB, {seconds:.1f} s -> {path}")
    print(f"total {total / 2**20:.2f} MiB in {directory}")


# ----------------------------------------------------------------------------------------------------------------
# default mode: model + timed steps (no anemoi-graphs needed)
# ----------------------------------------------------------------------------------------------------------------
def load_graph(path: Path) -> tuple[Any, dict[str, Any]]:
    """HeteroData rebuilt from a ``--build-graphs`` file, and the raw dict."""
    import torch
    from torch_geometric.data import HeteroData

    raw = torch.load(path, map_location="cpu", weights_only=True)
    if raw.get("format") != GRAPH_FORMAT:
        raise SystemExit(f"{path}: not a {GRAPH_FORMAT} file")
    graph = HeteroData()
    for name, node in raw["nodes"].items():
        graph[name].x = node["x"]
    for edge in raw["edges"].values():
        store = graph[(edge["src"], "to", edge["dst"])]
        store.edge_index = edge["edge_index"]
        for key in EDGE_ATTRIBUTES:
            store[key] = edge[key]
    return graph, raw


def summary_from_tensors(raw: dict[str, Any]) -> dict[str, int]:
    """Node and edge counts in the field names of run.py's ``graph`` JSON entry."""
    edges = raw["edges"]

    def count(key: str) -> int:
        return int(edges[key]["edge_index"].shape[1]) if key in edges else 0

    return {
        "data_nodes": int(raw["nodes"]["data"]["x"].shape[0]),
        "hidden_nodes": int(raw["nodes"]["hidden"]["x"].shape[0]),
        "edges_data2hidden": count("data->hidden"),
        "edges_hidden2hidden": count("hidden->hidden"),
        "edges_hidden2data": count("hidden->data"),
    }


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


def median(values: list[float]) -> float:
    """Median rounded to 10 µs."""
    return round(statistics.median(values), 5)


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Build graph + model, time warm-up + steps, return the result dict."""
    import torch
    import torch_geometric

    t_import0 = time.perf_counter()
    import anemoi.models
    import anemoi.models.models

    t_import = time.perf_counter() - t_import0
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.manual_seed(args.seed)

    graph_path = Path(args.graph or Path(args.graphs_dir) / f"{CASES[args.case].get('graph', args.case)}.pt")
    graph, raw = load_graph(graph_path)
    if raw["recipe"]["processor_edges"] != (args.processor == "graphtransformer"):
        raise SystemExit(f"{graph_path} was built for the other processor kind than --processor {args.processor}")

    t0 = time.perf_counter()
    model, data_indices = build_model(args, graph)
    model.to(device).train()
    t_model = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())

    nv_in = len(data_indices["data"].model.input)
    nv_out = len(data_indices["data"].model.output)
    grid = int(raw["nodes"]["data"]["x"].shape[0])
    gen = torch.Generator().manual_seed(args.seed)
    # model input layout: (batch, time, ensemble, grid, vars)
    x = {"data": torch.randn(args.batch, args.multistep, 1, grid, nv_in, generator=gen).to(device)}
    y = torch.randn(args.batch, args.n_step_output, 1, grid, nv_out, generator=gen).to(device)
    autocast_dtype = torch.bfloat16 if args.precision == "bf16-mixed" else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if args.optim == "adamw" else None

    def step() -> tuple[float, float, float]:
        """One forward + backward; returns (forward s, backward s, loss)."""
        if cuda:
            events = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            events[0].record()
        else:
            ta = time.perf_counter()
        with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
            out = model(x)["data"]
            loss = torch.nn.functional.mse_loss(out.float(), y)
        if cuda:
            events[1].record()
        else:
            tb = time.perf_counter()
        loss.backward()
        if optimizer is not None:
            optimizer.step()
        if cuda:
            events[2].record()
            events[2].synchronize()
            fwd, bwd = events[0].elapsed_time(events[1]) / 1e3, events[1].elapsed_time(events[2]) / 1e3
        else:
            tc = time.perf_counter()
            fwd, bwd = tb - ta, tc - tb
        model.zero_grad(set_to_none=True)
        return fwd, bwd, float(loss.detach())

    if cuda:
        torch.cuda.synchronize()
        mem_before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    t_warm0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    t_warm = time.perf_counter() - t_warm0

    fwd, bwd, tot, wall, losses = [], [], [], [], []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        f, b, loss = step()
        wall.append(time.perf_counter() - t0)
        fwd.append(f)
        bwd.append(b)
        tot.append(f + b)
        losses.append(loss)

    profiled = profile_summary(torch, step, args.profile_steps) if args.profile_steps else None
    backends = attention_backends(model)
    result: dict[str, Any] = {
        "profile": profiled,
        "system": "anemoi",
        "case": args.case,
        "precision": args.precision,
        "backend": ",".join(backends["graph_attention_backend"]),  # what the blocks use (triton falls back to pyg)
        "backend_requested": args.backend,
        "step_s_median": median(tot),
        "fwd_s_median": median(fwd),
        "bwd_s_median": median(bwd),
        "step_wall_s_median": median(wall),
        "step_s_min": round(min(tot), 5),
        "step_s_max": round(max(tot), 5),
    }
    if cuda:
        result["peak_mem_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        result["peak_reserved_mib"] = round(torch.cuda.max_memory_reserved() / 2**20, 1)
        result["mem_before_steps_mib"] = round(mem_before / 2**20, 1)
        result["peak_mem_steps_delta_mib"] = round((torch.cuda.max_memory_allocated() - mem_before) / 2**20, 1)
    else:
        result["peak_mem_mib"] = None
        result["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)
    result.update(
        {
            "params": n_params,
            "graph": summary_from_tensors(raw),
            "graph_recipe": raw["recipe"],
            "attention": backends,
            "loss_first": losses[0],
            "loss_finite": all(math.isfinite(v) for v in losses),
            "time_import_s": round(t_import, 3),
            "time_model_build_s": round(t_model, 3),
            "time_warmup_total_s": round(t_warm, 3),
            "step_s_all": [round(t, 5) for t in tot],
            "args": {
                k: v
                for k, v in vars(args).items()
                if k not in {"download_wheels", "build_graphs", "cases", "graphs_dir", "out", "verbose"}
            },
            "versions": versions(torch, torch_geometric, anemoi.models.__version__),
            "device": torch.cuda.get_device_name(device) if cuda else platform.processor() or platform.machine(),
            "env": {
                k: v
                for k, v in sorted(os.environ.items())
                if k.startswith(("ANEMOI_", "PYTORCH_", "TORCH_", "CUDA_", "TRITON_"))
            },
        }
    )
    return result


def versions(torch: Any, torch_geometric: Any, anemoi_models: str) -> dict[str, str | None]:
    """Versions of the stack that produced the numbers."""
    try:
        import triton

        triton_version: str | None = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "anemoi-models": anemoi_models,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "torch_geometric": torch_geometric.__version__,
        "python": platform.python_version(),
    }


# ----------------------------------------------------------------------------------------------------------------
# command line
# ----------------------------------------------------------------------------------------------------------------
def get_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse arguments; model sizes default to the chosen case's."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = p.add_argument_group("other modes (run here, not on the GPU)")
    modes.add_argument("--download-wheels", metavar="DIR", help="download the wheels of gpu_anchor_wheels.txt to DIR")
    modes.add_argument("--build-graphs", metavar="DIR", help="build the cases' graphs with anemoi-graphs into DIR")
    modes.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES), help="for --build-graphs")

    g = p.add_argument_group("benchmark")
    g.add_argument("--case", choices=sorted(CASES), default="R")
    g.add_argument("--graphs-dir", default=str(REPO / ".gpu-wheels" / "anchor_graphs"))
    g.add_argument("--graph", default="", help="graph file (default: GRAPHS_DIR/CASE.pt)")
    g.add_argument("--device", default="cuda")
    g.add_argument("--precision", choices=["fp32", "bf16-mixed"], default="fp32")
    g.add_argument("--backend", choices=["triton", "pyg"], default="triton", help="GraphTransformer attention backend")
    g.add_argument("--tf32", action="store_true", help="allow TF32 matmuls in fp32 (default off: strict fp32)")
    g.add_argument("--warmup", type=int, default=5)
    g.add_argument("--steps", type=int, default=20)
    g.add_argument("--batch", type=int, default=1)
    g.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--profile-steps", type=int, default=0, help="then profile this many steps (torch.profiler)")
    g.add_argument("--label", default="")
    g.add_argument("--out", default="", help="also append the JSON line to this file")
    g.add_argument("--verbose", action="store_true", help="anemoi INFO logging and warnings on stderr")

    m = p.add_argument_group("model (defaults: the case's)")
    m.add_argument("--channels", type=int, default=None)
    m.add_argument("--layers", type=int, default=None)
    m.add_argument("--heads", type=int, default=16)
    m.add_argument("--num-vars", type=int, default=None, help="default: the case's, else 8")
    m.add_argument("--multistep", type=int, default=2)
    m.add_argument("--n-step-output", type=int, default=1)
    m.add_argument("--mlp-hidden-ratio", type=float, default=4.0)
    m.add_argument("--num-chunks-mapper", type=int, default=4)
    m.add_argument("--num-chunks-processor", type=int, default=None, help="default: the case's, else 4")
    m.add_argument("--optim", choices=["none", "adamw"], default=None, help="default: the case's, else none")
    m.add_argument("--no-grad-checkpointing", action="store_true")
    m.add_argument(
        "--attention-implementation",
        default="scaled_dot_product_attention",
        help="TransformerProcessor attention (case T; anemoi's default flash_attention needs flash-attn)",
    )
    m.add_argument("--window-size", type=int, default=512)
    m.add_argument("--node-trainable", type=int, default=8)
    m.add_argument("--edge-trainable", type=int, default=8)
    a = p.parse_args(argv)

    spec = CASES[a.case]
    a.processor = spec["processor"]
    a.channels = a.channels or spec["channels"]
    a.layers = a.layers or spec["layers"]
    a.num_vars = a.num_vars or spec.get("num_vars", 8)
    a.num_chunks_processor = a.num_chunks_processor or spec.get("num_chunks_processor", 4)
    a.optim = a.optim or spec.get("optim", "none")
    if a.layers % a.num_chunks_processor:
        p.error(f"--num-chunks-processor ({a.num_chunks_processor}) must divide --layers ({a.layers})")
    if a.channels % a.heads:
        p.error(f"--channels ({a.channels}) must be divisible by --heads ({a.heads})")
    if a.steps < 1:
        p.error("--steps must be >= 1")
    return a


def main(argv: list[str] | None = None) -> None:
    """Dispatch to --download-wheels, --build-graphs or the benchmark."""
    args = get_args(argv)
    if args.download_wheels:
        download_wheels(Path(args.download_wheels))
        return
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        warnings.filterwarnings("ignore")
    if args.build_graphs:
        build_graphs(Path(args.build_graphs), args.cases)
        return
    result = run_benchmark(args)
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()

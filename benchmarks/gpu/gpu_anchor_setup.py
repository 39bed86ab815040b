"""What the anchor (ECMWF anemoi-models, ``gpu_anchor.py``) needs on the offline GPU machine, prepared here: its
wheels (``--download-wheels``, any Python with pip and network) and its graphs as plain tensors (``--build-graphs``,
the CPU anchor venv, which has anemoi-graphs); and the graph files' reader, used there. The cases live here because
both the graphs and the benchmark are made per case."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WHEELS_LIST = Path(__file__).resolve().with_name("gpu_anchor_wheels.txt")
GRAPH_FORMAT = "gpu_anchor_graph/1"

CASES: dict[str, dict[str, Any]] = {
    # same flags as benchmarks/anchor/compare_anchor.py (S, R, T); O96: an O96-sized grid (40320 points), mesh res 5
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
# the graph files, read on the GPU machine
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

"""On-disk cache of built graphs, keyed by the grid coordinates and the graph specification."""

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
from torch_geometric.data import HeteroData

from anemo_like.atomic_io import atomic_torch_save
from anemo_like.config.model_schema import GraphConfig, HiddenMesh, IcosahedralHidden, StretchedHidden
from anemo_like.graphs.builder import build_graph
from anemo_like.graphs.serialization import graph_from_tensors, graph_to_tensors, load_weights_only

LOGGER = logging.getLogger(__name__)

_DEFAULTS = GraphConfig()  # the config schema's graph.* defaults, the one source of them

# Bump when the graph construction changes so that stale cache files are not reused.
_CACHE_FORMAT_VERSION = 2  # 2: hidden nodes in Hilbert-curve order


def graph_cache_key(
    latitudes_deg: np.ndarray,
    longitudes_deg: np.ndarray,
    *,
    mesh_resolution: int,
    cutoff_factor: float,
    knn: int,
    processor_edges: bool,
    hidden: HiddenMesh = _DEFAULTS.hidden,
    region: np.ndarray | None = None,
) -> str:
    """16-hex-digit hash of the coordinates (as float64 degrees) and every build argument.

    An icosahedral graph's key is the one it had before regional meshes existed (same spec, no region). A regional
    graph's key holds the hidden spec instead of mesh_resolution (unused), and a stretched one also the region mask.
    """
    spec: dict[str, object] = {
        "version": _CACHE_FORMAT_VERSION,
        "cutoff_factor": float(cutoff_factor),
        "knn": int(knn),
        "processor_edges": bool(processor_edges),
    }
    if isinstance(hidden, IcosahedralHidden):
        spec["mesh_resolution"] = int(mesh_resolution)
    else:
        spec["hidden"] = hidden.model_dump()
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    for coordinates in (latitudes_deg, longitudes_deg):
        array = np.ascontiguousarray(coordinates, dtype=np.float64)
        digest.update(str(array.shape).encode())
        digest.update(array.tobytes())
    if isinstance(hidden, StretchedHidden) and region is not None:
        mask = np.asarray(region, dtype=bool)
        digest.update(f"region{mask.shape}".encode() + np.packbits(mask).tobytes())
    return digest.hexdigest()[:16]


def load_or_build_graph(
    latitudes_deg: np.ndarray,
    longitudes_deg: np.ndarray,
    *,
    cache_dir: Path | None,
    mesh_resolution: int,
    hidden: HiddenMesh = _DEFAULTS.hidden,
    region: np.ndarray | None = None,
    cutoff_factor: float = _DEFAULTS.cutoff_factor,
    knn: int = _DEFAULTS.knn,
    processor_edges: bool = True,
) -> HeteroData:
    """`build_graph`, reusing cache_dir/graph-<key>.pt when present; cache_dir None disables caching."""
    spec = {
        "mesh_resolution": mesh_resolution,
        "hidden": hidden,
        "region": region,
        "cutoff_factor": cutoff_factor,
        "knn": knn,
        "processor_edges": processor_edges,
    }
    if cache_dir is None:
        return build_graph(latitudes_deg, longitudes_deg, **spec)

    path = Path(cache_dir) / f"graph-{graph_cache_key(latitudes_deg, longitudes_deg, **spec)}.pt"
    if path.exists():
        start = time.perf_counter()
        graph = load_cached_graph(path, latitudes_deg, longitudes_deg)
        LOGGER.info("Loaded graph from %s in %.2f s", path, time.perf_counter() - start)
        return graph

    graph = build_graph(latitudes_deg, longitudes_deg, **spec)
    atomic_torch_save(graph_to_tensors(graph), path)
    LOGGER.info("Cached graph at %s", path)
    return graph


def load_cached_graph(path: Path, latitudes_deg: np.ndarray, longitudes_deg: np.ndarray) -> HeteroData:
    """Read a cached graph and check its data nodes are the given grid; raises ValueError naming the file."""
    remedy = "delete it and it will be rebuilt"
    try:
        tensors = load_weights_only(path, what="graph cache file")
    except ValueError as error:
        raise ValueError(f"{error}; {remedy}") from None
    try:
        graph = graph_from_tensors(tensors)
        coordinates = graph["data"].x.numpy()  # (N, 2) float32 radians: latitude, longitude
    except (ValueError, KeyError, AttributeError) as error:
        raise ValueError(f"{path} is not a valid graph cache file ({error}); {remedy}") from None
    grid = np.deg2rad(np.stack([latitudes_deg, longitudes_deg], axis=1)).astype(np.float32)
    if coordinates.shape != grid.shape or not np.allclose(coordinates, grid, atol=1e-6):
        raise ValueError(
            f"{path}: graph cache file was built for another grid ({coordinates.shape[0]} points; the dataset has "
            f"{grid.shape[0]}, or the coordinates differ); {remedy}"
        )
    return graph

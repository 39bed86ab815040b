"""Assemble the encoder–processor–decoder HeteroData graph for a set of grid points."""

import logging
import time

import numpy as np
import torch
from torch_geometric.data import HeteroData

from anemo_like.config.model_schema import GraphConfig
from anemo_like.graphs.areas import area_weights
from anemo_like.graphs.edge_attributes import edge_attributes
from anemo_like.graphs.edges import (
    cutoff_edges,
    knn_edges,
    max_nearest_neighbour_distance,
    multiscale_mesh_edges,
    sort_by_destination,
)
from anemo_like.graphs.icosahedron import RefinedIcosahedron, refined_icosahedron
from anemo_like.graphs.ordering import hilbert_order
from anemo_like.graphs.sphere import latlon_to_xyz, xyz_to_latlon

LOGGER = logging.getLogger(__name__)

DATA = "data"
HIDDEN = "hidden"
ENCODER = (DATA, "to", HIDDEN)
PROCESSOR = (HIDDEN, "to", HIDDEN)
DECODER = (HIDDEN, "to", DATA)
_DEFAULTS = GraphConfig()  # the config schema's graph.* defaults, the one source of them


def processor_levels(mesh_resolution: int) -> range:
    """Refinement levels whose triangle edges form the processor graph.

    Levels 1..r: the 63° edges of the bare icosahedron (level 0) are left out, as in ECMWF's
    multi-scale graphs (20400 edges at r=4). At r=0 the icosahedron is the only level and is used.
    """
    return range(min(1, mesh_resolution), mesh_resolution + 1)


def _validated_radians(latitudes_deg: np.ndarray, longitudes_deg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    latitudes = np.asarray(latitudes_deg, dtype=np.float64)
    longitudes = np.asarray(longitudes_deg, dtype=np.float64)
    if latitudes.ndim != 1 or latitudes.shape != longitudes.shape:
        raise ValueError(
            f"latitudes and longitudes must be 1-D of equal length, got {latitudes.shape} and {longitudes.shape}"
        )
    if not (np.isfinite(latitudes).all() and np.isfinite(longitudes).all()):
        raise ValueError("latitudes and longitudes must be finite")
    if np.abs(latitudes).max(initial=0.0) > 90.0:
        raise ValueError("latitudes must lie in [-90, 90] degrees")
    return np.deg2rad(latitudes), np.deg2rad(longitudes)


def _set_edges(
    graph: HeteroData,
    edge_type: tuple[str, str, str],
    edge_index: np.ndarray,
    source_xyz: np.ndarray,
    destination_xyz: np.ndarray,
) -> None:
    graph[edge_type].edge_index = torch.from_numpy(edge_index.astype(np.int64))
    graph[edge_type].edge_attr = torch.from_numpy(edge_attributes(source_xyz, destination_xyz, edge_index))


def _hidden_nodes_in_hilbert_order(mesh: RefinedIcosahedron) -> tuple[np.ndarray, np.ndarray]:
    """Hidden node positions (N_hidden, 3) along a Hilbert curve, and each mesh vertex's rank in that order."""
    hidden_order = hilbert_order(mesh.vertices)
    hidden_rank = np.empty_like(hidden_order)
    hidden_rank[hidden_order] = np.arange(len(hidden_order))
    return mesh.vertices[hidden_order], hidden_rank


def _encoder_edges(data_xyz: np.ndarray, hidden_xyz: np.ndarray, cutoff_radius: float) -> np.ndarray:
    """Data->hidden edges within ``cutoff_radius``; warns when some data nodes get none."""
    encoder_index = cutoff_edges(data_xyz, hidden_xyz, radius=cutoff_radius)
    unconnected = len(data_xyz) - len(np.unique(encoder_index[0]))
    if unconnected:
        LOGGER.warning(
            "%d of %d data nodes have no encoder edge (cutoff radius %.4f rad); consider a larger cutoff_factor",
            unconnected,
            len(data_xyz),
            cutoff_radius,
        )
    return encoder_index


def _log_built(graph: HeteroData, processor_edges: bool, seconds: float) -> None:
    LOGGER.info(
        "Built graph: %d data / %d hidden nodes, edges encoder %d, processor %d, decoder %d in %.2f s",
        graph[DATA].num_nodes,
        graph[HIDDEN].num_nodes,
        graph[ENCODER].num_edges,
        graph[PROCESSOR].num_edges if processor_edges else 0,
        graph[DECODER].num_edges,
        seconds,
    )


def build_graph(
    latitudes_deg: np.ndarray,
    longitudes_deg: np.ndarray,
    *,
    mesh_resolution: int,
    cutoff_factor: float = _DEFAULTS.cutoff_factor,
    knn: int = _DEFAULTS.knn,
    processor_edges: bool = True,
) -> HeteroData:
    """Graph with node sets "data" (the given points, in order) and "hidden" (refined icosahedron vertices
    in Hilbert-curve order, so that contiguous hidden index ranges are compact regions).

    latitudes_deg / longitudes_deg: (N_data,) in degrees. Node features `x` are float32 [lat, lon]
    in radians; "data" also has `area_weight` float32 (N_data,) with mean 1. Edge sets (edge_index
    int64 (2, E) sorted by destination, edge_attr float32 (E, 3) unit-std [length, dir_x, dir_y]):
    encoder data->hidden within cutoff_factor × the largest hidden nearest-neighbour distance,
    processor hidden->hidden multi-scale mesh edges (only if `processor_edges`), decoder
    hidden->data from the `knn` nearest hidden nodes. Globals: mesh_resolution, cutoff_factor,
    cutoff_radius (radians), knn. Defaults of cutoff_factor and knn: the config's (``graph.*``).
    """
    if cutoff_factor <= 0:
        raise ValueError(f"cutoff_factor must be > 0, got {cutoff_factor}")
    start = time.perf_counter()
    latitudes, longitudes = _validated_radians(latitudes_deg, longitudes_deg)
    data_xyz = latlon_to_xyz(latitudes, longitudes)
    mesh = refined_icosahedron(resolution=mesh_resolution)
    hidden_xyz, hidden_rank = _hidden_nodes_in_hilbert_order(mesh)
    cutoff_radius = cutoff_factor * max_nearest_neighbour_distance(hidden_xyz)

    graph = HeteroData()
    graph[DATA].x = torch.from_numpy(np.stack([latitudes, longitudes], axis=1).astype(np.float32))
    graph[DATA].area_weight = torch.from_numpy(area_weights(data_xyz))
    graph[HIDDEN].x = torch.from_numpy(xyz_to_latlon(hidden_xyz).astype(np.float32))
    _set_edges(graph, ENCODER, _encoder_edges(data_xyz, hidden_xyz, cutoff_radius), data_xyz, hidden_xyz)
    if processor_edges:
        mesh_index = multiscale_mesh_edges(mesh, levels=processor_levels(mesh_resolution))
        processor_index = sort_by_destination(hidden_rank[mesh_index])
        _set_edges(graph, PROCESSOR, processor_index, hidden_xyz, hidden_xyz)
    _set_edges(graph, DECODER, knn_edges(hidden_xyz, data_xyz, k=knn), hidden_xyz, data_xyz)

    graph.mesh_resolution = int(mesh_resolution)
    graph.cutoff_factor = float(cutoff_factor)
    graph.cutoff_radius = cutoff_radius
    graph.knn = int(knn)
    _log_built(graph, processor_edges, time.perf_counter() - start)
    return graph

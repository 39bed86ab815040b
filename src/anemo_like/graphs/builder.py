"""Assemble the encoder–processor–decoder HeteroData graph for a set of grid points."""

import logging
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch_geometric.data import HeteroData

from anemo_like.config.model_schema import (
    GraphConfig,
    HiddenMesh,
    IcosahedralHidden,
    LimitedAreaHidden,
    StretchedHidden,
)
from anemo_like.graphs.areas import area_weights, regional_area_weights
from anemo_like.graphs.edge_attributes import edge_attributes
from anemo_like.graphs.edges import (
    cutoff_edges,
    knn_edges,
    max_nearest_neighbour_distance,
    multiscale_mesh_edges,
    sort_by_destination,
    variable_radius_edges,
)
from anemo_like.graphs.icosahedron import refined_icosahedron
from anemo_like.graphs.ordering import hilbert_order
from anemo_like.graphs.stretched import regional_mesh
from anemo_like.sphere import latlon_to_xyz, xyz_to_latlon

LOGGER = logging.getLogger(__name__)

DATA = "data"
HIDDEN = "hidden"
ENCODER = (DATA, "to", HIDDEN)
PROCESSOR = (HIDDEN, "to", HIDDEN)
DECODER = (HIDDEN, "to", DATA)
_DEFAULTS = GraphConfig()  # the config schema's graph.* defaults, the one source of them
RegionalHidden = StretchedHidden | LimitedAreaHidden


@dataclass(frozen=True)
class _EdgeSpec:
    """The build arguments every kind of hidden mesh shares."""

    cutoff_factor: float
    knn: int
    processor_edges: bool


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


def _icosahedral_nodes(mesh_resolution: int, processor_edges: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """The refined icosahedron's vertices (N_hidden, 3) along a Hilbert curve, and its multi-scale processor
    edges (2, E) in that order (None without ``processor_edges``)."""
    mesh = refined_icosahedron(resolution=mesh_resolution)
    hidden_order = hilbert_order(mesh.vertices)
    if not processor_edges:
        return mesh.vertices[hidden_order], None
    hidden_rank = np.empty_like(hidden_order)
    hidden_rank[hidden_order] = np.arange(len(hidden_order))
    mesh_index = multiscale_mesh_edges(mesh, levels=processor_levels(mesh_resolution))
    return mesh.vertices[hidden_order], sort_by_destination(hidden_rank[mesh_index])


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


def _local_encoder_edges(data_xyz: np.ndarray, hidden_xyz: np.ndarray, radii: np.ndarray) -> np.ndarray:
    """Data->hidden edges within each hidden node's own radius (N_hidden,) radians; a data node left without
    any gets one from its nearest hidden node (logged)."""
    encoder_index = variable_radius_edges(data_xyz, hidden_xyz, radii=radii)
    unconnected = np.setdiff1d(np.arange(len(data_xyz)), encoder_index[0])
    if len(unconnected):
        LOGGER.info(
            "%d of %d data nodes are outside every hidden node's encoder radius and are linked to their nearest "
            "hidden node",
            len(unconnected),
            len(data_xyz),
        )
        nearest = knn_edges(hidden_xyz, data_xyz[unconnected], k=1)
        extra = np.stack([unconnected[nearest[1]], nearest[0]])
        encoder_index = sort_by_destination(np.concatenate([encoder_index, extra], axis=1))
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


def _validated_region(region: np.ndarray | None, num_points: int) -> np.ndarray | None:
    if region is None:
        return None
    mask = np.asarray(region)
    if mask.dtype != bool or mask.shape != (num_points,):
        raise ValueError(f"region must be a bool mask of shape ({num_points},), got {mask.dtype} {mask.shape}")
    return mask


def _regional_graph(
    graph: HeteroData, data_xyz: np.ndarray, region: np.ndarray | None, hidden: RegionalHidden, spec: _EdgeSpec
) -> None:
    """Hidden nodes, encoder and processor edges and globals of a stretched or limited-area graph."""
    mesh = regional_mesh(data_xyz, region, hidden)
    if spec.knn > len(mesh.xyz):
        raise ValueError(
            f"graph.knn ({spec.knn}) is more than the {len(mesh.xyz)} hidden nodes of the {hidden.kind} mesh; lower "
            "graph.knn or raise graph.hidden.region_resolution or graph.hidden.margin_km"
        )
    radii = spec.cutoff_factor * mesh.spacing
    graph[HIDDEN].x = torch.from_numpy(xyz_to_latlon(mesh.xyz).astype(np.float32))
    _set_edges(graph, ENCODER, _local_encoder_edges(data_xyz, mesh.xyz, radii), data_xyz, mesh.xyz)
    if spec.processor_edges:
        _set_edges(graph, PROCESSOR, mesh.processor_index, mesh.xyz, mesh.xyz)
    _set_edges(graph, DECODER, knn_edges(mesh.xyz, data_xyz, k=spec.knn), mesh.xyz, data_xyz)
    graph.mesh_resolution = hidden.region_resolution
    if isinstance(hidden, StretchedHidden):
        graph.global_resolution = hidden.global_resolution
    graph.region_resolution = hidden.region_resolution
    graph.margin_km = float(hidden.margin_km)
    graph.cutoff_radius = float(radii.max())


def _icosahedral_graph(graph: HeteroData, data_xyz: np.ndarray, mesh_resolution: int, spec: _EdgeSpec) -> None:
    """Hidden nodes, encoder and processor edges and globals of a graph over the whole refined icosahedron."""
    hidden_xyz, processor_index = _icosahedral_nodes(mesh_resolution, spec.processor_edges)
    cutoff_radius = spec.cutoff_factor * max_nearest_neighbour_distance(hidden_xyz)
    graph[HIDDEN].x = torch.from_numpy(xyz_to_latlon(hidden_xyz).astype(np.float32))
    _set_edges(graph, ENCODER, _encoder_edges(data_xyz, hidden_xyz, cutoff_radius), data_xyz, hidden_xyz)
    if processor_index is not None:
        _set_edges(graph, PROCESSOR, processor_index, hidden_xyz, hidden_xyz)
    _set_edges(graph, DECODER, knn_edges(hidden_xyz, data_xyz, k=spec.knn), hidden_xyz, data_xyz)
    graph.mesh_resolution = int(mesh_resolution)
    graph.cutoff_radius = cutoff_radius


def build_graph(
    latitudes_deg: np.ndarray,
    longitudes_deg: np.ndarray,
    *,
    mesh_resolution: int = _DEFAULTS.mesh_resolution,
    hidden: HiddenMesh = _DEFAULTS.hidden,
    region: np.ndarray | None = None,
    cutoff_factor: float = _DEFAULTS.cutoff_factor,
    knn: int = _DEFAULTS.knn,
    processor_edges: bool = True,
) -> HeteroData:
    """Graph with node sets "data" (the given points, in order) and "hidden" (refined icosahedron vertices
    in Hilbert-curve order, so that contiguous hidden index ranges are compact regions).

    latitudes_deg / longitudes_deg: (N_data,) in degrees. Node features `x` are float32 [lat, lon]
    in radians; "data" also has `area_weight` float32 (N_data,) with mean 1 (a limited-area grid's edge cells
    are bounded at about its spacing). Edge sets (edge_index int64 (2, E) sorted by destination, edge_attr
    float32 (E, 3) unit-std [length, dir_x, dir_y]): encoder data->hidden, processor hidden->hidden
    multi-scale mesh edges (only if `processor_edges`), decoder hidden->data from the `knn` nearest hidden nodes.

    hidden (``graph.hidden``): icosahedral, the whole mesh of `mesh_resolution`, encoder radius cutoff_factor ×
    the largest hidden nearest-neighbour distance; stretched (needs `region`, (N_data,) bool) or limited_area
    (`region` not used: all points are the region), see :func:`regional_mesh`, encoder radius cutoff_factor ×
    each hidden node's local spacing, and every data node linked at least to its nearest hidden node.
    Globals: mesh_resolution (the finest level), cutoff_factor, cutoff_radius (radians, the largest), knn; a
    regional mesh adds region_resolution, margin_km and (stretched) global_resolution.
    Defaults of mesh_resolution, hidden, cutoff_factor and knn: the config's (``graph.*``).
    """
    if cutoff_factor <= 0:
        raise ValueError(f"cutoff_factor must be > 0, got {cutoff_factor}")
    start = time.perf_counter()
    LOGGER.info("building the graph of %d grid points (%s hidden mesh)", len(latitudes_deg), hidden.kind)
    latitudes, longitudes = _validated_radians(latitudes_deg, longitudes_deg)
    region = _validated_region(region, len(latitudes))
    data_xyz = latlon_to_xyz(latitudes, longitudes)
    spec = _EdgeSpec(cutoff_factor=float(cutoff_factor), knn=int(knn), processor_edges=processor_edges)

    graph = HeteroData()
    graph[DATA].x = torch.from_numpy(np.stack([latitudes, longitudes], axis=1).astype(np.float32))
    regional_grid = isinstance(hidden, LimitedAreaHidden)
    graph[DATA].area_weight = torch.from_numpy((regional_area_weights if regional_grid else area_weights)(data_xyz))
    if isinstance(hidden, IcosahedralHidden):
        _icosahedral_graph(graph, data_xyz, mesh_resolution, spec)
    else:
        _regional_graph(graph, data_xyz, region, hidden, spec)
    graph.cutoff_factor = spec.cutoff_factor
    graph.knn = spec.knn
    _log_built(graph, processor_edges, time.perf_counter() - start)
    return graph

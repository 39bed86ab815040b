"""anemoi's graph as it is, in the form our model reads: edges stably sorted by destination (as anemoi's
``StaticGraphProvider`` sorts them), their attributes concatenated in the configured order and permuted alike."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import HeteroData

from anemo_like.anemoi_import.archive import ImportRefused
from anemo_like.anemoi_import.content import AnemoiContent
from anemo_like.anemoi_import.spec import AnemoiSpec
from anemo_like.graphs.areas import area_weights
from anemo_like.graphs.builder import DATA, DECODER, ENCODER, HIDDEN, PROCESSOR
from anemo_like.sphere import latlon_to_xyz


def _coordinates(content: AnemoiContent, name: str) -> Tensor:
    x = content.nodes.get(name, {}).get("x")
    if not isinstance(x, Tensor) or x.dim() != 2 or x.shape[1] != 2:
        raise ImportRefused(f"the graph's '{name}' nodes hold no (N, 2) latitude/longitude coordinates")
    return x


def _edges(content: AnemoiContent, key: tuple[str, str, str], attributes: tuple[str, ...]) -> tuple[Tensor, ...]:
    """(edge_index (2, E) sorted by destination, attributes (E, A) float32, perm (E,)) of anemoi's edges ``key``."""
    store = content.edges.get(key)
    if store is None or not isinstance(store.get("edge_index"), Tensor):
        raise ImportRefused(f"the graph has no {key[0]} -> {key[2]} edges")
    missing = [name for name in attributes if not isinstance(store.get(name), Tensor)]
    if missing:
        raise ImportRefused(f"the graph's {key[0]} -> {key[2]} edges lack the attribute(s) {missing}")
    edge_index = store["edge_index"].long()
    perm = torch.sort(edge_index[1], stable=True).indices
    attr = torch.cat([store[name].reshape(edge_index.shape[1], -1) for name in attributes], dim=1)
    return edge_index[:, perm], attr[perm].float(), perm


def anemoi_graph(content: AnemoiContent, spec: AnemoiSpec) -> tuple[HeteroData, dict[str, Tensor]]:
    """Our graph of anemoi's nodes and edges, and each edge set's permutation from anemoi's raw order to ours
    ("encoder", "processor", "decoder"). The data nodes' area weights (for scores and losses) are their spherical
    Voronoi areas, mean 1, as our own graphs have them."""
    data, hidden = spec.dataset, spec.hidden
    graph = HeteroData()
    graph[DATA].x = _coordinates(content, data)
    graph[HIDDEN].x = _coordinates(content, hidden)
    latlon = graph[DATA].x.double().numpy()
    graph[DATA].area_weight = torch.from_numpy(area_weights(latlon_to_xyz(latlon[:, 0], latlon[:, 1])))
    perms = {}
    for part, ours, theirs in (
        ("encoder", ENCODER, (data, "to", hidden)),
        ("processor", PROCESSOR, (hidden, "to", hidden)),
        ("decoder", DECODER, (hidden, "to", data)),
    ):
        edge_index, attr, perms[part] = _edges(content, theirs, spec.edge_attributes)
        sizes = (graph[ours[0]].num_nodes, graph[ours[2]].num_nodes)
        if edge_index.numel() and (edge_index.min() < 0 or (edge_index.max(dim=1).values >= torch.tensor(sizes)).any()):
            raise ImportRefused(f"the graph's {theirs[0]} -> {theirs[2]} edges index nodes it does not have")
        graph[ours].edge_index, graph[ours].edge_attr = edge_index, attr
    if not np.isfinite(latlon).all():
        raise ImportRefused("the graph's data node coordinates are not finite")
    return graph, perms

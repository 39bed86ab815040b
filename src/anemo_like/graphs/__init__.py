"""Encoder–processor–decoder graphs on the sphere: grid points ("data") and a refined icosahedron ("hidden")."""

from anemo_like.graphs.builder import build_graph
from anemo_like.graphs.cache import load_or_build_graph
from anemo_like.graphs.serialization import graph_fingerprint, graph_from_tensors, graph_to_tensors

__all__ = ["build_graph", "graph_fingerprint", "graph_from_tensors", "graph_to_tensors", "load_or_build_graph"]

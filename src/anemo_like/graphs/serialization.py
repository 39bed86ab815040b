"""Flatten a HeteroData graph into plain tensors (for torch.save / weights_only loads) and back, and load such
files with errors that name the file."""

import hashlib
import pickle
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import HeteroData

_NODE_PREFIX = "node"
_EDGE_PREFIX = "edge"
_GLOBAL_PREFIX = "global"
_SEPARATOR = "/"
# Key of the graph-level attributes in HeteroData.to_dict() / HeteroData.from_dict().
_GLOBAL_STORE = "_global_store"


def _scalar_tensor(value: bool | int | float | torch.Tensor, key: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool):
        return torch.tensor(value, dtype=torch.bool)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    raise TypeError(f"graph attribute {key!r} has unsupported type {type(value).__name__}")


def graph_to_tensors(graph: HeteroData) -> dict[str, torch.Tensor]:
    """Flat {name: tensor} dict holding every node, edge and global attribute of `graph`.

    Names are "node/<type>/<attr>", "edge/<src>/<rel>/<dst>/<attr>" and "global/<attr>"; global
    bool/int/float values become 0-d tensors.
    """
    tensors = {}
    for node_type in graph.node_types:
        for attr, value in graph[node_type].items():
            tensors[_SEPARATOR.join((_NODE_PREFIX, node_type, attr))] = _scalar_tensor(value, attr)
    for edge_type in graph.edge_types:
        for attr, value in graph[edge_type].items():
            tensors[_SEPARATOR.join((_EDGE_PREFIX, *edge_type, attr))] = _scalar_tensor(value, attr)
    for attr, value in graph.to_dict()[_GLOBAL_STORE].items():
        tensors[_SEPARATOR.join((_GLOBAL_PREFIX, attr))] = _scalar_tensor(value, attr)
    return tensors


def graph_from_tensors(tensors: dict[str, torch.Tensor]) -> HeteroData:
    """Inverse of `graph_to_tensors`; 0-d globals come back as Python scalars."""
    mapping: dict = {_GLOBAL_STORE: {}}
    for name, tensor in tensors.items():
        prefix, *parts = name.split(_SEPARATOR)
        if prefix == _NODE_PREFIX and len(parts) == 2:
            mapping.setdefault(parts[0], {})[parts[1]] = tensor
        elif prefix == _EDGE_PREFIX and len(parts) == 4:
            mapping.setdefault(tuple(parts[:3]), {})[parts[3]] = tensor
        elif prefix == _GLOBAL_PREFIX and len(parts) == 1:
            mapping[_GLOBAL_STORE][parts[0]] = tensor.item() if tensor.dim() == 0 else tensor
        else:
            raise ValueError(f"unrecognised graph tensor name {name!r}")
    return HeteroData.from_dict(mapping)


def graph_fingerprint(graph: HeteroData) -> str:
    """16-hex-digit SHA-256 of every tensor's name, dtype, shape and bytes; stable across runs."""
    return tensors_fingerprint(graph_to_tensors(graph))


def tensors_fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """:func:`graph_fingerprint` of the graph that ``tensors`` (from :func:`graph_to_tensors`) flatten."""
    digest = hashlib.sha256()
    for name, tensor in sorted(tensors.items()):
        contiguous = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{contiguous.dtype}|{tuple(contiguous.shape)}|".encode())
        digest.update(contiguous.numpy().tobytes())
    return digest.hexdigest()[:16]


def load_weights_only(path: Path, *, what: str, mmap: bool = False) -> Any:
    """``torch.load(path, weights_only=True)`` on the CPU; ``what`` names the expected content in errors; ``mmap``:
    the tensors are mapped from the file, read as they are first used.

    A file that is not a complete ``torch.save`` archive, or that holds pickled code (which ``weights_only``
    refuses to run), raises ValueError naming the file: never a loader traceback, never a hint to load it unsafely.
    """
    if path.stat().st_size == 0:
        raise ValueError(
            f"{path} is not a valid {what}: the file is empty (0 bytes: a copy or a write that did not finish)"
        )
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is not a valid {what}: not a complete torch.save archive (truncated, corrupted or another kind "
            "of file)"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as error:
        blocked = re.search(r"GLOBAL ([\w.]+)", str(error))
        if blocked:
            raise ValueError(
                f"{path} is not a safe {what}: it holds pickled Python code ({blocked.group(1)}), which "
                "torch.load(weights_only=True) refuses to run; do not use files from untrusted sources"
            ) from None
        raise ValueError(
            f"{path} is not a valid {what}: its contents are corrupted or not plain tensors (weights_only load refused)"
        ) from None
    except RuntimeError as error:  # the archive reader's complaint: its first sentence says what broke
        reason = str(error).split(". ", 1)[0]
        raise ValueError(f"{path} is not a valid {what}: the archive is corrupted ({reason})") from None

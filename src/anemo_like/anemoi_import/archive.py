"""An anemoi checkpoint file: its zip archive, the JSON metadata and supporting arrays inside, and its pickle read
without running code (:mod:`.safe_pickle`).

anemoi-training writes two kinds: ``inference-*.ckpt`` (``torch.save`` of the whole ``AnemoiModelInterface``) and
Lightning's ``last.ckpt`` (a ``state_dict`` and ``hyper_parameters``). Both carry ``<dir>/anemoi-metadata/anemoi.json``
(older files: ``ai-models.json``) and raw ``*.numpy`` supporting arrays listed in it.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from anemo_like.anemoi_import.safe_pickle import Inert, RefusedGlobal, safe_pickle_module

METADATA_NAMES = ("anemoi-metadata/anemoi.json", "anemoi-metadata/ai-models.json")
INTERFACE = "anemoi.models.interface.AnemoiModelInterface"
Kind = Literal["inference", "lightning"]


class ImportRefused(ValueError):
    """A file or option ``anemo-import`` does not take; the message names it and says what to do."""


@dataclass(frozen=True)
class AnemoiArchive:
    """What an anemoi checkpoint holds, read without running any of its pickled code."""

    path: Path
    kind: Kind  # inference-*.ckpt (a pickled module) or Lightning's last.ckpt
    root: Any  # the unpickled object: an inert AnemoiModelInterface, or Lightning's dict
    metadata: dict[str, Any]  # anemoi.json
    supporting_arrays: dict[str, np.ndarray]  # "<dataset>/<name>" -> array (latitudes, longitudes, masks)
    sha256: str  # of the whole file


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _open_zip(path: Path) -> zipfile.ZipFile:
    if not path.is_file():
        raise ImportRefused(f"{path} does not exist or is not a file; give an anemoi inference-*.ckpt or last.ckpt")
    if path.stat().st_size == 0:
        raise ImportRefused(f"{path} is empty (0 bytes): a copy or a write that did not finish")
    if not zipfile.is_zipfile(path):
        raise ImportRefused(
            f"{path} is not an anemoi checkpoint: not a complete zip archive (truncated, corrupted or another kind of "
            "file); give an inference-*.ckpt or last.ckpt as anemoi-training wrote it"
        )
    return zipfile.ZipFile(path)


def _metadata(archive: zipfile.ZipFile, path: Path) -> tuple[str, dict[str, Any]]:
    """The archive's folder name and its anemoi metadata."""
    for name in archive.namelist():
        folder, _, rest = name.partition("/")
        if rest in METADATA_NAMES:
            try:
                return folder, json.loads(archive.read(name))
            except (zipfile.BadZipFile, json.JSONDecodeError, UnicodeDecodeError) as error:
                raise ImportRefused(f"{path}: its metadata {name} is corrupted ({error})") from None
    ours = any(name.endswith("/data.pkl") for name in archive.namelist())
    hint = (
        " (a torch.save archive without anemoi's metadata: an anemo_like inference.pt needs no import)" if ours else ""
    )
    raise ImportRefused(
        f"{path} is not an anemoi checkpoint: it holds no anemoi-metadata/anemoi.json{hint}; give an "
        "inference-*.ckpt or last.ckpt written by anemoi-training"
    )


def _supporting_arrays(archive: zipfile.ZipFile, metadata: dict[str, Any], path: Path) -> dict[str, np.ndarray]:
    arrays = {}
    for dataset, entries in (metadata.get("supporting_arrays_paths") or {}).items():
        for name, entry in (entries or {}).items():
            try:
                raw = archive.read(entry["path"])
                arrays[f"{dataset}/{name}"] = np.frombuffer(raw, dtype=entry["dtype"]).reshape(entry["shape"])
            except (KeyError, ValueError, TypeError, zipfile.BadZipFile) as error:
                raise ImportRefused(f"{path}: supporting array {dataset}/{name} is unreadable ({error})") from None
    return arrays


def _unpickle(path: Path) -> Any:
    """The archive's pickle, rebuilt by :mod:`.safe_pickle`: nothing in it runs."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False, pickle_module=safe_pickle_module, mmap=False)
    except RefusedGlobal as refused:
        raise ImportRefused(
            f"{path} is not a safe checkpoint: its pickle calls {refused.name}, which no anemoi checkpoint needs; "
            "nothing in it was run. Do not use files from untrusted sources"
        ) from None
    except (pickle.UnpicklingError, RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as error:
        reason = str(error).split(". ", 1)[0].splitlines()[0] if str(error) else type(error).__name__
        raise ImportRefused(f"{path} is not a readable checkpoint: the archive is corrupted ({reason})") from None


def _kind(root: Any, path: Path) -> Kind:
    if isinstance(root, Inert) and root.kind == INTERFACE:
        return "inference"
    if isinstance(root, dict) and "state_dict" in root and "hyper_parameters" in root:
        return "lightning"
    what = root.kind if isinstance(root, Inert) else type(root).__name__
    raise ImportRefused(
        f"{path}: a layout anemo-import does not know (it holds a {what}, not an {INTERFACE} or a Lightning "
        "checkpoint); give an inference-*.ckpt or last.ckpt written by anemoi-training"
    )


def read_archive(path: Path) -> AnemoiArchive:
    """Read ``path``; :class:`ImportRefused` names the file and what is wrong with it."""
    with _open_zip(path) as archive:
        _, metadata = _metadata(archive, path)
        arrays = _supporting_arrays(archive, metadata, path)
        try:
            bad = archive.testzip()
        except (zipfile.BadZipFile, OSError, EOFError) as error:
            raise ImportRefused(f"{path} is not a readable checkpoint: the archive is corrupted ({error})") from None
        if bad is not None:
            raise ImportRefused(f"{path} is not a readable checkpoint: its member {bad} is corrupted (CRC mismatch)")
    root = _unpickle(path)
    return AnemoiArchive(path, _kind(root, path), root, metadata, arrays, file_sha256(path))

"""A damaged anemoi-datasets zarr named file by file: broken metadata, undecodable chunks and missing chunk files;
and a dataset path with no dataset at it (nothing, a file, a symbolic link that leads nowhere).

zarr reports a broken file without its name (a bare ``JSONDecodeError`` or ``error during blosc decompression``)
and reads a missing chunk file as the fill value. These helpers find the file and say what it holds; they run when
a dataset is opened (a few small files) or after a read has already failed, never on the hot path.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numcodecs
import numpy as np
import zarr

from anemo_like.links import broken_link

RECOPY = "re-copy or rebuild the dataset"
_METADATA_FILES = (".zgroup", ".zattrs", ".zarray", ".zmetadata", "zarr.json")
_REQUIRED_KEYS = {
    ".zgroup": ("zarr_format",),
    ".zarray": ("zarr_format", "shape", "chunks", "dtype"),
    "zarr.json": ("zarr_format", "node_type"),
}
_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_BLOSC_HEADER = struct.Struct("<BBBBIII")  # version, versionlz, flags, typesize, nbytes, blocksize, cbytes


class DatasetError(ValueError):
    """A problem of a dataset's contents, raised while reading samples.

    torch's DataLoader re-raises an error from a worker process as the same type, with the worker's traceback
    prepended to the message; that prefix is dropped so the user sees the message alone.
    """

    def __init__(self, message: str) -> None:
        marker = f"{type(self).__name__}: "
        if message.startswith("Caught ") and marker in message:
            message = message.rsplit(marker, 1)[1].strip()
        super().__init__(message)


class CorruptDatasetError(DatasetError):
    """A file of a dataset is truncated, corrupted or missing; the message names the file and what it holds."""


def short_reason(error: BaseException) -> str:
    """The first line of the error's message (at most 160 characters), or its type name when it has none."""
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 160 else text[:157] + "..."


def metadata_error(file: Path, problem: str) -> CorruptDatasetError:
    return CorruptDatasetError(
        f"{file}: cannot read this zarr metadata file: {problem}; the file is truncated or corrupted: {RECOPY}"
    )


def _metadata_problem(file: Path) -> str | None:
    """What is wrong with one metadata file, or None: JSON syntax, the document's type, zarr's required keys."""
    raw = file.read_bytes()
    if not raw.strip():
        return "it is empty"
    try:
        document = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return "it is not text (binary content)"
    except json.JSONDecodeError as error:
        return f"not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
    if not isinstance(document, dict):
        return f"expected a JSON object, found {_JSON_TYPES.get(type(document), 'null')}"
    missing = [f"'{key}'" for key in _REQUIRED_KEYS.get(file.name, ()) if key not in document]
    if missing:
        return f"it lacks the key(s) {', '.join(missing)} of zarr metadata"
    return None


def check_metadata_files(root: Path) -> None:
    """Parse the zarr metadata files of ``root`` and of the folders just below it (its arrays); raise
    :class:`CorruptDatasetError` naming the first broken one."""
    for folder in [root, *sorted(child for child in root.iterdir() if child.is_dir())]:
        for name in _METADATA_FILES:
            file = folder / name
            if file.is_file() and (problem := _metadata_problem(file)) is not None:
                raise metadata_error(file, problem)


def array_metadata_file(folder: Path) -> Path:
    """The file describing the array stored in ``folder``: ``.zarray`` (v2) or ``zarr.json`` (v3)."""
    return next((folder / name for name in (".zarray", "zarr.json") if (folder / name).exists()), folder)


def open_array(group: zarr.Group, root: Path, key: str) -> zarr.Array | None:
    """The array ``key`` of ``group``, None if there is none; metadata zarr refuses is named as a broken file."""
    try:
        node = group.get(key)
    except Exception as error:  # zarr's validation errors have no common base
        raise metadata_error(array_metadata_file(root / key), f"zarr cannot read it ({short_reason(error)})") from error
    if node is not None and not isinstance(node, zarr.Array):
        raise metadata_error(array_metadata_file(root / key), "it does not describe a zarr array")
    return node


def chunk_file(array: zarr.Array, root: Path, coords: tuple[int, ...]) -> Path:
    return root / array.path / array.metadata.encode_chunk_key(coords)


def chunk_error(file: Path, name: str, holds: str, reason: str) -> CorruptDatasetError:
    where = f" ({holds})" if holds else ""
    return CorruptDatasetError(
        f"{file}: cannot decode this chunk of array '{name}'{where}: {reason}; "
        f"the file is truncated or corrupted: {RECOPY}"
    )


def find_undecodable_chunk(
    array: zarr.Array, root: Path, chunks: Iterable[tuple[int, ...]], holds: Callable[[tuple[int, ...]], str]
) -> CorruptDatasetError | None:
    """Decode each of ``chunks`` alone and return the error naming the first that fails, None if all decode
    (or a chunk fails for an operating-system reason: the caller re-raises that error, which names the file)."""
    for coords in chunks:
        try:
            array.get_block_selection(coords)
        except Exception as error:
            if isinstance(error, OSError) and error.errno is not None:
                return None
            return chunk_error(chunk_file(array, root, coords), array.basename, holds(coords), short_reason(error))
    return None


def chunks_of(shape: Sequence[int], chunks: Sequence[int], selection: Sequence[slice | int]) -> Iterable[tuple]:
    """Chunk coordinates a basic selection (slices with steps, ints) reads."""
    per_axis = []
    for length, size, index in zip(shape, chunks, selection, strict=True):
        positions = np.arange(length)[index]
        per_axis.append(np.unique(np.atleast_1d(positions) // size).tolist())
    return itertools.product(*per_axis)


def check_blosc_frames(array: zarr.Array, root: Path, name: str) -> None:
    """Compare each chunk file's size with its blosc header: blosc decodes a cut-short frame of a small,
    uncompressed chunk without error, returning whatever memory follows it."""
    compressors = array.compressors
    if array.shards is not None or not compressors:
        return
    if not isinstance(compressors[-1], numcodecs.Blosc | zarr.codecs.BloscCodec):
        return
    for coords in np.ndindex(array.cdata_shape):
        file = chunk_file(array, root, coords)
        if not file.is_file() or file.stat().st_size < _BLOSC_HEADER.size:
            continue  # missing: the fill value; shorter than a header: blosc refuses it
        with file.open("rb") as stream:
            expected = _BLOSC_HEADER.unpack(stream.read(_BLOSC_HEADER.size))[-1]
        size = file.stat().st_size
        if expected != size:
            raise chunk_error(file, name, "", f"its blosc header gives {expected} bytes but the file has {size}")


def find_missing_chunk(
    array: zarr.Array, root: Path, *, allowed: Callable[[tuple[int, ...]], bool] = lambda coords: False
) -> tuple[int, ...] | None:
    """The first chunk of ``array`` that has no file (zarr would read it as the fill value) and is not
    ``allowed`` to be missing, or None. Lists the array's folder once; the chunk keys are only built when there
    are fewer chunk files than chunks."""
    folder = root / array.path
    present = set()
    for directory, _, files in os.walk(folder):
        prefix = Path(directory).relative_to(folder).as_posix()
        present.update(name if prefix == "." else f"{prefix}/{name}" for name in files)
    if len(present - set(_METADATA_FILES)) >= array.nchunks:
        return None
    encode = array.metadata.encode_chunk_key
    return next(
        (c for c in np.ndindex(array.cdata_shape) if encode(c) not in present and not allowed(c)),
        None,
    )


def describe_data_chunk(
    coords: tuple[int, ...], chunks: Sequence[int], dates: np.ndarray, variables: Sequence[str]
) -> str:
    """The dates and variables one chunk of the ``data`` array holds, e.g.
    ``date 2000-01-01T00:00:00, variables sp, t_850, z_500``."""
    first = coords[0] * chunks[0]
    last = min(first + chunks[0], len(dates)) - 1
    when = f"date {dates[first]}" if first == last else f"dates {dates[first]} .. {dates[last]}"
    names = list(variables[coords[1] * chunks[1] : (coords[1] + 1) * chunks[1]])
    listed = ", ".join(names) if len(names) <= 4 else f"{', '.join(names[:3])}, ... ({len(names)} variables)"
    return f"{when}, variables {listed}"


def read_whole(array: zarr.Array, root: Path) -> np.ndarray:
    """All values of a small array (dates, coordinates, statistics), its chunk files' blosc headers checked first:
    blosc reads a cut-short frame on into whatever memory follows it. A missing chunk file is not an error here:
    zarr writers leave out a chunk that holds only the fill value (an all-zero array has no chunk file)."""
    check_blosc_frames(array, root, array.basename)
    try:
        return array[...]
    except Exception as error:
        corrupt = find_undecodable_chunk(array, root, np.ndindex(array.cdata_shape), lambda coords: "")
        if corrupt is None:
            raise
        raise corrupt from error


def dataset_folder(path: str | Path) -> Path:
    """The folder a dataset path names, resolved; one message when nothing, a file or a broken link is there."""
    given = Path(path).expanduser().absolute()
    broken = broken_link(given)
    if broken is not None:  # a loop would fail to resolve, a link to nothing be named by its target
        raise FileNotFoundError(
            f"{given}: no such dataset: the path {broken}; fix the link, or give the anemoi-datasets zarr directory "
            "itself"
        )
    folder = given.resolve()
    if not folder.exists():
        raise FileNotFoundError(f"{folder}: no such dataset (expected an anemoi-datasets zarr directory)")
    if not folder.is_dir():
        raise ValueError(f"{folder}: is a file, not a dataset (expected an anemoi-datasets zarr directory)")
    return folder


def open_group(root: Path) -> zarr.Group:
    """The zarr group at ``root``; a broken metadata file is named, a folder without any says so."""
    check_metadata_files(root)
    try:
        return zarr.open_group(root, mode="r")
    except PermissionError:
        raise
    except Exception as error:  # zarr's validation errors have no common base
        for file in (root / ".zgroup", root / "zarr.json"):
            if file.is_file():
                raise metadata_error(file, f"zarr cannot read it ({short_reason(error)})") from error
        raise ValueError(
            f"{root}: not a zarr group (no .zgroup or zarr.json inside; expected an anemoi-datasets zarr directory)"
        ) from error


def check_unique_variables(root: Path, variables: Sequence[str]) -> None:
    """Each variable name must appear once: a repeated name would make variable lookups ambiguous."""
    repeated = []
    for name, count in Counter(variables).items():
        if count > 1:
            positions = [str(i) for i, other in enumerate(variables) if other == name]
            times = "twice" if count == 2 else f"{count} times"
            repeated.append(f"'{name}' {times} (positions {', '.join(positions[:-1])} and {positions[-1]})")
    if repeated:
        raise ValueError(
            f"{root}: 'variables' lists {', '.join(repeated)}; each variable needs its own name: rename or drop "
            "the duplicate (fix the attribute or rebuild the dataset)"
        )


def check_data_chunks(root: Path, data: zarr.Array, dates: np.ndarray, variables: Sequence[str], attrs: dict) -> None:
    """Every chunk of ``data`` has a file, except chunks whose dates are all listed in ``missing_dates``: zarr reads
    a lost chunk file as NaN without a word (``write_anemoi_zarr`` writes every chunk, all-NaN ones too)."""
    try:
        absent = {np.datetime64(date, "s") for date in attrs.get("missing_dates") or []}
    except ValueError as error:
        raise ValueError(f"{root}: 'missing_dates' holds a value that is not a date ({error})") from error
    size = data.chunks[0]

    def allowed(coords: tuple[int, ...]) -> bool:
        return bool(absent) and all(date in absent for date in dates[coords[0] * size : (coords[0] + 1) * size])

    missing = find_missing_chunk(data, root, allowed=allowed)
    if missing is not None:
        raise CorruptDatasetError(
            f"{chunk_file(data, root, missing)}: the chunk file of array 'data' "
            f"({describe_data_chunk(missing, data.chunks, dates, variables)}) is missing, so zarr would read it as "
            f"its fill value ({data.fill_value}); {RECOPY}, or list its dates in the 'missing_dates' attribute if "
            "they are missing on purpose"
        )

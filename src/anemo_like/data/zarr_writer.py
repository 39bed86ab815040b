"""Write anemoi-datasets zarr archives (format v2 or v3) in the layout :mod:`~anemo_like.data.zarr_store` reads:
built in a sibling temporary folder and renamed into place, statistics computed over all dates."""

from __future__ import annotations

import datetime
import os
import shutil
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numcodecs
import numpy as np
import zarr

from anemo_like.data.zarr_errors import check_unique_variables
from anemo_like.data.zarr_store import STATISTICS, check_dates, dataset_key_error, format_frequency, parse_frequency


def compute_statistics(data: np.ndarray) -> dict[str, np.ndarray]:
    """Per-variable mean, stdev, minimum, maximum over dates, ensembles and grid of (dates, vars, ens, grid) data.

    Non-finite values (missing data) are left out; a variable with no finite value gets NaN statistics.
    """
    stats: dict[str, list[float]] = {key: [] for key in STATISTICS}
    for variable in range(data.shape[1]):
        values = np.asarray(data[:, variable], dtype=np.float64)
        values = values[np.isfinite(values)]
        if values.size == 0:
            values = np.array([np.nan])
        stats["mean"].append(values.mean())
        stats["stdev"].append(values.std())
        stats["minimum"].append(values.min())
        stats["maximum"].append(values.max())
    return {key: np.array(values, dtype=np.float64) for key, values in stats.items()}


def _compressors(zarr_format: int) -> Any:
    """Blosc zstd with byte shuffle in both formats: float32 fields compress ~2x better than without shuffle."""
    if zarr_format == 2:
        return numcodecs.Blosc(cname="zstd", clevel=5, shuffle=numcodecs.Blosc.SHUFFLE)
    return zarr.codecs.BloscCodec(cname="zstd", clevel=5, shuffle="shuffle")


def _check_layout(
    path: Path, data: np.ndarray, variables: list[str], dates: np.ndarray, grid_lengths: tuple[int, int]
) -> None:
    """Raise ValueError naming the key when ``data`` is not 4-D or an axis length disagrees with its labels."""
    if data.ndim != 4:
        raise dataset_key_error(
            path, "data", f"has shape {data.shape}; expected 4 dims (dates, variables, ensembles, grid)"
        )
    n_dates, n_vars, _, n_grid = data.shape
    expected = {
        "variables": (len(variables), n_vars),
        "dates": (len(dates), n_dates),
        "latitudes": (grid_lengths[0], n_grid),
        "longitudes": (grid_lengths[1], n_grid),
    }
    for key, (got, want) in expected.items():
        if got != want:
            raise dataset_key_error(
                path, key, f"has length {got}; expected {want} to match 'data' of shape {data.shape}"
            )
    check_unique_variables(path, variables)


def _group_attributes(
    variables: list[str], dates: np.ndarray, step: datetime.timedelta, shape: tuple[int, ...], attrs: dict[str, Any]
) -> dict[str, Any]:
    """The anemoi-datasets group attributes of a store, updated with ``attrs``."""
    return {
        "variables": variables,
        "frequency": format_frequency(step),
        "start_date": str(dates[0]),
        "end_date": str(dates[-1]),
        "dimensions": ["dates", "variables", "ensembles", "values"],
        "shape": list(shape),
        "dtype": "float32",
        "missing_dates": [],
        "statistics_start_date": str(dates[0]),
        "statistics_end_date": str(dates[-1]),
        **attrs,
    }


def _write_group(
    path: Path, *, data: np.ndarray, small: dict[str, np.ndarray], attrs: dict[str, Any], zarr_format: int
) -> None:
    """Create the zarr group at ``path``: ``data`` one date per chunk, then each array of ``small`` whole."""
    _, n_vars, n_ens, n_grid = data.shape
    group = zarr.open_group(path, mode="w-", zarr_format=zarr_format)
    group.attrs.update(attrs)
    array = group.create_array(
        "data",
        shape=data.shape,
        chunks=(1, n_vars, n_ens, n_grid),
        dtype="float32",
        compressors=_compressors(zarr_format),
        fill_value=np.nan,
        # flat chunk files in both formats: v3's default "c/0/0/0/0" makes a folder per date
        chunk_key_encoding={"name": "v2" if zarr_format == 2 else "default", "separator": "."},
        config={"write_empty_chunks": True},  # every chunk has a file: a missing one is damage (see open_anemoi_zarr)
    )
    array[...] = data
    for key, values in small.items():
        group.create_array(key, data=values, compressors=_compressors(zarr_format))


def write_anemoi_zarr(
    path: str | Path,
    *,
    data: np.ndarray,
    variables: Sequence[str],
    dates: np.ndarray,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    frequency: str,
    zarr_format: int = 2,
    attrs: dict[str, Any] | None = None,
) -> Path:
    """Write an anemoi-datasets style zarr at ``path`` (must not exist) and return its resolved path.

    ``data`` is (dates, variables, ensembles, grid) and is stored as float32, one date per chunk; statistics are
    computed over all dates. The store is built in a sibling temporary directory and renamed into place, so a crash
    never leaves a partial dataset at ``path``.
    """
    path = Path(path).expanduser().resolve()
    if path.exists():
        raise FileExistsError(f"{path}: already exists; remove it first or choose another path")
    if zarr_format not in (2, 3):
        raise ValueError(f"{path}: zarr_format must be 2 or 3, got {zarr_format}")
    data = np.asarray(data, dtype=np.float32)
    dates = np.asarray(dates, dtype="datetime64[s]")
    variables = [str(name) for name in variables]
    step = parse_frequency(frequency)
    _check_layout(path, data, variables, dates, (len(latitudes), len(longitudes)))
    check_dates(path, dates, step)
    small = {
        "dates": dates,
        "latitudes": np.asarray(latitudes, dtype=np.float64),
        "longitudes": np.asarray(longitudes, dtype=np.float64),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        _write_group(
            tmp,
            data=data,
            small={**small, **compute_statistics(data)},
            attrs=_group_attributes(variables, dates, step, data.shape, attrs or {}),
            zarr_format=zarr_format,
        )
        os.rename(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path

"""Per-point masks stored beside a dataset's ``data``: the regional points of a combined (cut-out) grid and the
forced boundary strip of a limited-area dataset.

Each mask is a 1-D bool array (n_grid,) named :data:`REGION` or :data:`BOUNDARY` in the dataset's zarr group.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from anemo_like.data.views import DatasetView
from anemo_like.data.zarr_errors import open_array, open_group
from anemo_like.data.zarr_store import AnemoiZarr

REGION = "region"  # True on the points of the regional (high-resolution) dataset of a cut-out grid
BOUNDARY = "boundary"  # True on the boundary points of a limited-area grid, whose values are forced
POINT_MASKS = (REGION, BOUNDARY)


def point_mask(store: AnemoiZarr, name: str) -> np.ndarray | None:
    """The mask ``name`` of ``store`` as (n_grid,) bool (a view's own, else the stored array), or None when the
    dataset has none."""
    if name not in POINT_MASKS:
        raise ValueError(f"unknown point mask {name!r}; expected one of {', '.join(POINT_MASKS)}")
    if isinstance(store, DatasetView):
        return store.point_masks.get(name)
    array = open_array(open_group(store.path), store.path, name)
    if array is None:
        return None
    mask = np.asarray(array[:]).astype(bool)
    if mask.shape != (store.shape[-1],):
        raise ValueError(
            f"{store.path}: '{name}' has shape {mask.shape}; expected ({store.shape[-1]},), one flag per grid point"
        )
    return mask


def write_point_mask(path: Path, name: str, mask: np.ndarray) -> None:
    """Store (n_grid,) bool ``mask`` as array ``name`` in the zarr group at ``path`` (before it is renamed into
    place: writers build a store in a temporary folder)."""
    if name not in POINT_MASKS:
        raise ValueError(f"unknown point mask {name!r}; expected one of {', '.join(POINT_MASKS)}")
    group = zarr.open_group(path, mode="r+")
    values = np.asarray(mask, dtype=bool)
    array = group.create_array(name, shape=values.shape, dtype="bool", overwrite=True)
    array[:] = values

"""Which kind of global grid a dataset's points form, for writing them in a grid format (GRIB): a regular lat/lon
grid, a regular or reduced Gaussian grid, or an unstructured set of points.

The points must be ordered as those formats order them, rows north to south and each row from 0° east, equally
spaced in longitude; points in any other order are unstructured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from anemo_like.data.grids import gaussian_latitudes

GridName = Literal["regular_ll", "regular_gg", "reduced_gg", "unstructured"]
TOLERANCE = 1e-4  # degrees (11 m): coordinates stored as float32 (2e-5 apart near 360) are this close


@dataclass(frozen=True)
class GridKind:
    """A grid's kind and its rows (north to south); an unstructured grid has no rows."""

    name: GridName
    row_latitudes: np.ndarray  # (R,) degrees, north to south; (0,) when unstructured
    row_sizes: np.ndarray  # (R,) points per row, int64

    @property
    def gaussian_number(self) -> int:
        """N of a Gaussian grid (R = 2N rows); 0 for the other kinds."""
        return len(self.row_sizes) // 2 if self.name in ("regular_gg", "reduced_gg") else 0


UNSTRUCTURED = GridKind("unstructured", np.zeros(0), np.zeros(0, dtype=np.int64))


def _rows(latitudes: np.ndarray, longitudes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(row latitudes, row sizes) when the points are rows north to south, each equally spaced from 0°; else None."""
    breaks = np.flatnonzero(np.abs(np.diff(latitudes)) > TOLERANCE) + 1
    starts = np.concatenate([[0], breaks])
    sizes = np.diff(np.concatenate([starts, [latitudes.size]]))
    row_latitudes = latitudes[starts]
    if np.any(np.diff(row_latitudes) >= 0):  # not north to south
        return None
    expected = np.arange(latitudes.size) - np.repeat(starts, sizes)  # each point's index in its row
    expected = expected * np.repeat(360.0 / sizes, sizes)
    offset = np.abs((longitudes - expected + 180.0) % 360.0 - 180.0)  # 360 and 0 are the same longitude
    if offset.max() > TOLERANCE or np.abs(latitudes - np.repeat(row_latitudes, sizes)).max() > TOLERANCE:
        return None
    return row_latitudes, sizes.astype(np.int64)


def classify_grid(latitudes: np.ndarray, longitudes: np.ndarray) -> GridKind:
    """The kind of the grid of points (latitudes, longitudes) (G,) in degrees.

    2N rows on the Gaussian latitudes of N: ``regular_gg`` when every row has as many points, else ``reduced_gg``
    (octahedral O<N> or classic N<N>, any row sizes); equally spaced rows of equal size: ``regular_ll`` (cell
    centred or from the poles); anything else: ``unstructured``.
    """
    latitudes, longitudes = (np.asarray(a, dtype=np.float64).ravel() for a in (latitudes, longitudes))
    rows = _rows(latitudes, longitudes) if latitudes.size > 1 else None
    if rows is None or len(rows[0]) < 2:
        return UNSTRUCTURED
    row_latitudes, sizes = rows
    same_size = bool(np.all(sizes == sizes[0]))
    if len(row_latitudes) % 2 == 0:
        gaussian, _ = gaussian_latitudes(len(row_latitudes) // 2)
        if np.abs(gaussian - row_latitudes).max() <= TOLERANCE:
            return GridKind("regular_gg" if same_size else "reduced_gg", row_latitudes, sizes)
    spacing = np.diff(row_latitudes)
    if same_size and np.abs(spacing - spacing.mean()).max() <= TOLERANCE:
        return GridKind("regular_ll", row_latitudes, sizes)
    return UNSTRUCTURED

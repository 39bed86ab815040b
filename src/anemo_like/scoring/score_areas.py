"""Which grid points validation and verification score, and the parts reported beside the whole grid.

A combined (cut-out) dataset has a ``region`` point mask: its scores are also given for the regional points and for
the rest. A limited-area dataset has a ``boundary`` mask: its forced boundary points are not predicted, so every
score covers the interior only. Both masks are read from the dataset (:mod:`anemo_like.data.point_masks`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from anemo_like.data.point_masks import BOUNDARY, REGION, point_mask
from anemo_like.data.zarr_store import AnemoiZarr

REST = "rest"  # the points of a combined dataset outside the region


@dataclass(frozen=True, kw_only=True)
class ScoreAreas:
    """``interior`` (G,) bool: the points scored (False on forced boundary points); ``parts``: name -> (G,) bool,
    ``region`` and ``rest`` (each within the interior) for a dataset with a region mask, else empty."""

    interior: np.ndarray
    parts: dict[str, np.ndarray]

    @classmethod
    def whole(cls, num_points: int) -> ScoreAreas:
        """Every point scored, no parts."""
        return cls(interior=np.ones(num_points, dtype=bool), parts={})

    @property
    def names(self) -> list[str]:
        """The parts' names, in the order of the rows after the first of :meth:`weights`."""
        return list(self.parts)

    @property
    def num_boundary(self) -> int:
        """Points left out of every score."""
        return int((~self.interior).sum())

    def weights(self, area_weight: np.ndarray) -> np.ndarray:
        """(1 + len(parts), G) float64: ``area_weight`` (G,) on the interior (row 0), then on each part, 0 on the
        other points; each row sums to 1 (a part without points: all 0, its scores NaN)."""
        masks = np.stack([self.interior, *self.parts.values()])
        rows = np.where(masks, np.asarray(area_weight, dtype=np.float64)[None], 0.0)
        total = rows.sum(axis=1, keepdims=True)
        return rows / np.where(total > 0, total, 1.0)

    def note(self) -> str:
        """A sentence for the header of a score table: which points are scored ('' when all are)."""
        if self.num_boundary == 0:
            return ""
        return (
            f"Interior points only: the {self.num_boundary} forced boundary points (of {self.interior.size}) are "
            "left out of every score."
        )


def score_areas(store: AnemoiZarr) -> ScoreAreas:
    """The points scored and the parts of ``store``, from its point masks."""
    num_points = store.shape[-1]
    boundary = point_mask(store, BOUNDARY)
    interior = np.ones(num_points, dtype=bool) if boundary is None else ~boundary
    region = point_mask(store, REGION)
    if region is None:
        return ScoreAreas(interior=interior, parts={})
    return ScoreAreas(interior=interior, parts={REGION: region & interior, REST: ~region & interior})

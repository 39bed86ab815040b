"""Forcings computed from the date and position instead of read from the dataset."""

from __future__ import annotations

import numpy as np


def computed_forcings(names: list[str], dates: np.ndarray, longitudes_deg: np.ndarray) -> np.ndarray:
    """Values of the named forcings, (T, V, G) float32, for ``dates`` (T,) datetime64 and grid longitudes (G,)."""
    dates = dates.astype("datetime64[s]")
    seconds_of_day = (dates - dates.astype("datetime64[D]")).astype(np.float64)
    year_start = dates.astype("datetime64[Y]")
    year_seconds = ((year_start + 1).astype("datetime64[s]") - year_start).astype(np.float64)  # 365 or 366 days
    year_angle = 2 * np.pi * (dates - year_start).astype(np.float64) / year_seconds
    local_angle = 2 * np.pi * (seconds_of_day[:, None] / 86400.0 + longitudes_deg[None, :] / 360.0)
    grid = longitudes_deg.shape[0]
    by_name = {
        "cos_julian_day": lambda: np.repeat(np.cos(year_angle)[:, None], grid, axis=1),
        "sin_julian_day": lambda: np.repeat(np.sin(year_angle)[:, None], grid, axis=1),
        "cos_local_time": lambda: np.cos(local_angle),
        "sin_local_time": lambda: np.sin(local_angle),
    }
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"unknown computed forcing(s) {unknown}; available: {list(by_name)}")
    if not names:
        return np.zeros((len(dates), 0, grid), dtype=np.float32)
    return np.stack([by_name[n]() for n in names], axis=1).astype(np.float32)

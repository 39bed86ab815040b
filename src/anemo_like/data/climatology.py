"""The climatology baseline: each grid point's time mean over a date range, the forecast that knows no weather."""

from __future__ import annotations

import numpy as np

from anemo_like.data.zarr_store import AnemoiZarr
from anemo_like.progress import Progress


def mean_state(
    store: AnemoiZarr, *, date_start: int, date_stop: int, variables: np.ndarray, max_dates: int
) -> np.ndarray:
    """Time mean (G, V) float64, physical units, of at most ``max_dates`` dates evenly spaced in [start, stop).

    ``variables`` are indices into the store's variables. Non-finite values are left out of each point's mean.
    """
    count = min(max_dates, date_stop - date_start)
    if count < 1:
        raise ValueError(f"{store.path}: no dates to average into a climatology ({date_start} .. {date_stop})")
    dates = np.unique(np.linspace(date_start, date_stop - 1, count).round().astype(np.int64))
    total = np.zeros((len(variables), store.shape[-1]))
    finite = np.zeros_like(total)
    with Progress(total=len(dates), desc="climatology", unit="date") as shown:  # minutes on a large grid
        for date in dates:
            values = store.read(slice(date, date + 1), variables)[0].astype(np.float64)  # (V, G)
            ok = np.isfinite(values)
            total += np.where(ok, values, 0.0)
            finite += ok
            shown.update()
    with np.errstate(invalid="ignore", divide="ignore"):
        return (total / finite).T

"""Write ``earthkit_forcings.npz``: golden values of the computed forcings from earthkit-data's ``forcings`` source.

Run with a Python that has earthkit-data 0.20 installed (the tests do not need it), from the repository root:

    /tmp/anemoi-training/venv/bin/python tests/data/make_earthkit_forcings.py

The file holds ``latitudes`` and ``longitudes`` (G,) float64 degrees (paired points, not a grid: poles, the
dateline, negative longitudes and longitudes above 180), ``dates`` (T,) ISO strings to the second (UTC),
``names`` (V,) and ``values`` (T, V, G) float64 as earthkit returns them; ``earthkit_version`` records the version.
"""

from __future__ import annotations

import datetime
from pathlib import Path

import earthkit.data
import numpy as np
from earthkit.data import from_source

NAMES = [
    "cos_julian_day",
    "sin_julian_day",
    "cos_local_time",
    "sin_local_time",
    "cos_latitude",
    "sin_latitude",
    "cos_longitude",
    "sin_longitude",
    "insolation",
    "cos_solar_zenith_angle",
]

DATES = [
    "1979-01-01T03:00:00",
    "1999-06-21T12:00:00",
    "2000-01-01T00:00:00",
    "2000-02-29T00:00:00",
    "2000-02-29T06:30:00",
    "2000-12-31T18:00:00",
    "2019-12-31T23:59:59",
    "2023-03-20T21:45:00",
    "2024-06-30T13:15:30",
    "2024-09-22T06:30:00",
    "2100-03-01T00:00:00",
    "2100-12-31T23:00:00",
]

# (latitude, longitude) in degrees
FIXED_POINTS = [
    (90.0, 0.0),
    (-90.0, 0.0),
    (90.0, 123.0),
    (-90.0, -77.0),
    (89.9, 200.0),
    (-89.9, -10.0),
    (0.0, 0.0),
    (0.0, 180.0),
    (0.0, -180.0),
    (0.0, 179.75),
    (0.0, -179.75),
    (0.0, 180.25),
    (0.0, 360.0),
    (0.0, 359.75),
    (0.0, 270.0),
    (0.0, -90.0),
    (23.44, -0.25),
    (-23.44, 200.0),
    (66.56, 300.0),
    (-66.56, -300.0),
    (45.0, -45.0),
    (-45.0, 45.0),
    (51.5, -0.12),
    (-33.9, 151.2),
    (64.1, -21.9),
    (35.7, 139.7),
]


def points() -> tuple[np.ndarray, np.ndarray]:
    """The fixed points, then 14 seeded random ones with longitudes in [-180, 360)."""
    rng = np.random.default_rng(20000229)
    extra_lat = np.round(rng.uniform(-90, 90, 14), 3)
    extra_lon = np.round(rng.uniform(-180, 360, 14), 3)
    lat = np.concatenate([[p[0] for p in FIXED_POINTS], extra_lat])
    lon = np.concatenate([[p[1] for p in FIXED_POINTS], extra_lon])
    return lat.astype(np.float64), lon.astype(np.float64)


def main() -> None:
    lat, lon = points()
    dates = [datetime.datetime.fromisoformat(d) for d in DATES]
    fields = from_source("forcings", latitudes=lat, longitudes=lon, date=dates, param=NAMES)
    values = np.full((len(dates), len(NAMES), lat.size), np.nan)
    for field in fields:
        t = dates.index(datetime.datetime.fromisoformat(field.metadata("valid_datetime")))
        v = NAMES.index(field.metadata("param"))
        values[t, v] = field.to_numpy(flatten=True, dtype=np.float64)
    assert np.isfinite(values).all(), "earthkit did not return every (date, name)"
    out = Path(__file__).with_name("earthkit_forcings.npz")
    np.savez_compressed(
        out,
        latitudes=lat,
        longitudes=lon,
        dates=np.array(DATES),
        names=np.array(NAMES),
        values=values,
        earthkit_version=np.array(earthkit.data.__version__),
    )
    print(f"wrote {out}: values {values.shape} from earthkit-data {earthkit.data.__version__}")


if __name__ == "__main__":
    main()

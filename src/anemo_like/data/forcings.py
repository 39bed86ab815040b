"""Forcings computed from the date and position instead of read from the dataset.

They follow earthkit-data's ``forcings`` source (the one anemoi-datasets uses to build datasets), so a model sees
the same values here as in a dataset built by anemoi-datasets (checked against earthkit-data 0.20 to 1e-6, see
tests/test_computed_forcings.py). Dates are UTC; angles in degrees on input. Per name:

- ``cos_julian_day``, ``sin_julian_day``: of 2π · (days since 1 January 00:00 of the date's year) / 365.25; the
  year is 365.25 days long whatever the calendar, so the angle steps back by up to 0.75 days at a year end;
- ``cos_local_time``, ``sin_local_time``: of 2π · local time / 24 h, local time = (lon / 15 + UTC hours) mod 24;
- ``cos_latitude``, ``sin_latitude``, ``cos_longitude``, ``sin_longitude``: of the grid's coordinates;
- ``cos_solar_zenith_angle`` and its other name ``insolation``: the cosine of the solar zenith angle, negative
  values (sun below the horizon) set to 0, with earthkit's Fourier series for the solar declination and the
  equation of time in the julian-day angle. As earthkit does, the hour angle takes the whole UTC hour only
  (minutes and seconds are dropped there, though not in the declination).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

DAYS_PER_YEAR = 365.25  # earthkit's year, for every calendar year

# Fourier coefficients in the julian-day angle a, for cos(k a), sin(k a), k = 0, 1, 2, 3 (earthkit-data).
_DECLINATION_DEG = ((0.396372, 0.0), (-22.91327, 4.025430), (-0.387205, 0.051967), (-0.154527, 0.084798))
_TIME_CORRECTION_DEG = ((0.004297, 0.0), (0.107029, -1.837877), (-0.837378, -2.340475))

# (dates (T,) datetime64[s], latitudes (G,) deg, longitudes (G,) deg) -> values broadcastable to (T, G), float64
Forcing = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _julian_angle(dates: np.ndarray) -> np.ndarray:
    """(T, 1) radians: 2π · days since the start of the date's year / 365.25."""
    days = (dates - dates.astype("datetime64[Y]")).astype(np.float64) / 86400.0
    return (days / DAYS_PER_YEAR * 2 * np.pi)[:, None]


def _local_time_angle(dates: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """(T, G) radians: 2π · local solar-mean time / 24 h."""
    hours = (dates - dates.astype("datetime64[D]")).astype(np.float64) / 3600.0
    local_hours = (longitudes[None, :] / 360.0 * 24.0 + hours[:, None]) % 24
    return local_hours / 24 * 2 * np.pi


def _fourier(angle: np.ndarray, coefficients: tuple[tuple[float, float], ...]) -> np.ndarray:
    """sum over k of c_k cos(k angle) + s_k sin(k angle)."""
    return sum(c * np.cos(k * angle) + s * np.sin(k * angle) for k, (c, s) in enumerate(coefficients))


def _cos_solar_zenith_angle(dates: np.ndarray, latitudes: np.ndarray, longitudes: np.ndarray) -> np.ndarray:
    """(T, G) cosine of the solar zenith angle, clipped below at 0."""
    angle = _julian_angle(dates)  # (T, 1)
    declination = np.deg2rad(_fourier(angle, _DECLINATION_DEG))
    whole_hours = (dates.astype("datetime64[h]") - dates.astype("datetime64[D]")).astype(np.float64)[:, None]
    hour_angle = np.deg2rad((whole_hours - 12) * 15 + longitudes[None, :] + _fourier(angle, _TIME_CORRECTION_DEG))
    lat = np.deg2rad(latitudes)[None, :]
    cos_zenith = np.sin(declination) * np.sin(lat) + np.cos(declination) * np.cos(lat) * np.cos(hour_angle)
    return np.clip(cos_zenith, 0.0, None)


FORCINGS: dict[str, Forcing] = {
    "cos_julian_day": lambda dates, lat, lon: np.cos(_julian_angle(dates)),
    "sin_julian_day": lambda dates, lat, lon: np.sin(_julian_angle(dates)),
    "cos_local_time": lambda dates, lat, lon: np.cos(_local_time_angle(dates, lon)),
    "sin_local_time": lambda dates, lat, lon: np.sin(_local_time_angle(dates, lon)),
    "cos_latitude": lambda dates, lat, lon: np.cos(np.deg2rad(lat)),
    "sin_latitude": lambda dates, lat, lon: np.sin(np.deg2rad(lat)),
    "cos_longitude": lambda dates, lat, lon: np.cos(np.deg2rad(lon)),
    "sin_longitude": lambda dates, lat, lon: np.sin(np.deg2rad(lon)),
    "cos_solar_zenith_angle": _cos_solar_zenith_angle,
    "insolation": _cos_solar_zenith_angle,
}


def computed_forcings(
    names: list[str], dates: np.ndarray, latitudes_deg: np.ndarray, longitudes_deg: np.ndarray
) -> np.ndarray:
    """Values of the named forcings, (T, V, G) float32 (computed in float64), for ``dates`` (T,) datetime64 (UTC)
    at the grid points ``latitudes_deg``, ``longitudes_deg`` (G,) degrees; V = len(names), in that order."""
    unknown = [name for name in names if name not in FORCINGS]
    if unknown:
        raise ValueError(f"unknown computed forcing(s) {unknown}; available: {list(FORCINGS)}")
    dates = np.asarray(dates).astype("datetime64[s]")
    lat = np.asarray(latitudes_deg, dtype=np.float64)
    lon = np.asarray(longitudes_deg, dtype=np.float64)
    if lat.shape != lon.shape or lat.ndim != 1:
        raise ValueError(f"latitudes {lat.shape} and longitudes {lon.shape} must be two (G,) arrays of one length")
    out = np.empty((len(dates), len(names), lon.size), dtype=np.float32)
    for v, name in enumerate(names):
        out[:, v] = FORCINGS[name](dates, lat, lon)
    return out

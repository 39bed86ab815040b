"""What the cut-out and limited-area tests share: a regular 2-degree box of 11 x 11 points at the equator, a coarse
12 x 24 global grid, and small anemoi stores on them whose fields are linear in xyz plus noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from bad_input_helpers import N_DATES, VARIABLES

from anemo_like.data.sphere import unit_vectors
from anemo_like.data.zarr_writer import write_anemoi_zarr

BOX_ROWS = 11  # the box: latitudes -10 .. 10, longitudes 0 .. 20, every 2 degrees
DATES = np.datetime64("2000-01-01T00", "s") + np.arange(N_DATES) * np.timedelta64(6, "h")
METADATA = {"variables_metadata": {"sp": {"units": "Pa"}}, "constant_fields": ["cos_latitude"]}


def box_grid() -> tuple[np.ndarray, np.ndarray]:
    """(121,) latitudes and longitudes of the box, row by row from the south."""
    lat, lon = np.meshgrid(np.linspace(-10.0, 10.0, BOX_ROWS), np.linspace(0.0, 20.0, BOX_ROWS), indexing="ij")
    return lat.ravel(), lon.ravel()


def global_grid(nlat: int = 12, nlon: int = 24) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centred regular grid, (nlat * nlon,) latitudes and longitudes."""
    lat, lon = np.meshgrid(
        -90.0 + (np.arange(nlat) + 0.5) * 180.0 / nlat, np.arange(nlon) * 360.0 / nlon, indexing="ij"
    )
    return lat.ravel(), lon.ravel()


def linear_fields(latitudes: np.ndarray, longitudes: np.ndarray, *, seed: int, noise: float) -> np.ndarray:
    """(dates, variables, 1, grid) float32: per variable and date a linear function of xyz, plus ``noise``."""
    rng = np.random.default_rng(seed)
    xyz = unit_vectors(latitudes, longitudes)
    slopes = rng.normal(size=(N_DATES, len(VARIABLES), 3))
    values = np.einsum("dvk,gk->dvg", slopes, xyz) + noise * rng.normal(size=(N_DATES, len(VARIABLES), len(xyz)))
    return values[:, :, None, :].astype(np.float32)


def write_store(
    path: Path,
    latitudes: np.ndarray,
    longitudes: np.ndarray,
    *,
    seed: int = 0,
    noise: float = 1.0,
    variables: list[str] = VARIABLES,
    dates: np.ndarray = DATES,
    frequency: str = "6h",
) -> Path:
    """A store of ``variables`` (a subset of VARIABLES, in any order) on the given grid."""
    data = linear_fields(latitudes, longitudes, seed=seed, noise=noise)[:, [VARIABLES.index(v) for v in variables]]
    return write_anemoi_zarr(
        path,
        data=data[: len(dates)],
        variables=variables,
        dates=dates,
        latitudes=latitudes,
        longitudes=longitudes,
        frequency=frequency,
        attrs=METADATA,
    )

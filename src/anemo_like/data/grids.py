"""Grid geometry of the datasets the field trains on: octahedral reduced Gaussian grids ``O<N>`` (ECMWF's
operational family: O96 has 40,320 points, O320 421,120, O1280 6,599,680) and regular cell-centred lat/lon grids.

An ``O<N>`` grid has 2N latitude rows at the Gaussian latitudes (the roots of the Legendre polynomial of degree 2N
in sin(latitude)); the i-th row from either pole (i = 1..N) holds 4i + 16 points, equally spaced in longitude
from 0°. The quadrature weight of a row, shared by its points, is each point's area.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
from scipy.special import roots_legendre


@dataclass(frozen=True)
class Grid:
    """Points of a global grid, north to south, each row from 0° east."""

    latitudes: np.ndarray  # (G,) degrees
    longitudes: np.ndarray  # (G,) degrees in [0, 360)
    areas: np.ndarray  # (G,) steradians, summing to 4π

    @property
    def size(self) -> int:
        return int(self.latitudes.size)


def gaussian_latitudes(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The 2n Gaussian latitudes (degrees, north to south) and their quadrature weights (summing to 2)."""
    sines, weights = roots_legendre(2 * n)  # ascending: south to north
    return np.degrees(np.arcsin(sines[::-1])), weights[::-1]


def octahedral_row_sizes(n: int) -> np.ndarray:
    """Points per row of ``O<n>``, north to south: 20, 24, ..., 4n + 16, 4n + 16, ..., 20."""
    north = 4 * np.arange(1, n + 1) + 16
    return np.concatenate([north, north[::-1]])


def octahedral_grid(n: int) -> Grid:
    """The octahedral reduced Gaussian grid ``O<n>`` (4n² + 36n points)."""
    if n < 1:
        raise ValueError(f"an octahedral grid O<N> needs N >= 1, got O{n}")
    latitudes, weights = gaussian_latitudes(n)
    sizes = octahedral_row_sizes(n)
    longitudes = np.concatenate([np.arange(size) * (360.0 / size) for size in sizes])
    areas = np.repeat(2 * np.pi * weights / sizes, sizes)  # a row's band is 2π w of the sphere's 4π
    return Grid(latitudes=np.repeat(latitudes, sizes), longitudes=longitudes, areas=areas)


def regular_grid(nlat: int, nlon: int) -> Grid:
    """A cell-centred ``nlat`` x ``nlon`` lat/lon grid, north to south."""
    if nlat < 1 or nlon < 1:
        raise ValueError(f"a regular grid NLATxNLON needs NLAT >= 1 and NLON >= 1, got {nlat}x{nlon}")
    edges = np.radians(np.linspace(90.0, -90.0, nlat + 1))
    latitudes = np.degrees((edges[:-1] + edges[1:]) / 2)
    bands = 2 * np.pi * (np.sin(edges[:-1]) - np.sin(edges[1:])) / nlon  # steradians per cell of each row
    longitudes = np.tile(np.arange(nlon) * (360.0 / nlon), nlat)
    return Grid(latitudes=np.repeat(latitudes, nlon), longitudes=longitudes, areas=np.repeat(bands, nlon))


def grid_from_name(name: str) -> Grid:
    """``O96`` (octahedral) or ``96x192`` (regular, NLATxNLON) as a :class:`Grid`."""
    if match := re.fullmatch(r"[Oo](\d+)", name):
        return octahedral_grid(int(match.group(1)))
    if match := re.fullmatch(r"(\d+)[xX](\d+)", name):
        return regular_grid(int(match.group(1)), int(match.group(2)))
    raise ValueError(f"grid {name!r}: expected O<N> (an octahedral reduced Gaussian grid, e.g. O96) or NLATxNLON")

"""Grid geometry: octahedral reduced Gaussian grids O<N> and regular lat/lon grids."""

from __future__ import annotations

import numpy as np
import pytest

from anemo_like.data.grids import gaussian_latitudes, grid_from_name, octahedral_grid, octahedral_row_sizes


@pytest.mark.parametrize(("n", "points"), [(1, 40), (48, 10_944), (96, 40_320), (160, 108_160), (320, 421_120)])
def test_octahedral_point_counts(n: int, points: int) -> None:
    assert octahedral_row_sizes(n).sum() == points == 4 * n * n + 36 * n
    if n <= 96:
        assert octahedral_grid(n).size == points


def test_gaussian_latitudes_are_the_legendre_roots() -> None:
    # P2: x = ±1/√3; P4: x = ±sqrt(3/7 ± 2/7 sqrt(6/5)), in closed form
    one, _ = gaussian_latitudes(1)
    np.testing.assert_allclose(one, np.degrees(np.arcsin([1 / np.sqrt(3), -1 / np.sqrt(3)])), rtol=0, atol=1e-12)
    outer, inner = np.sqrt(3 / 7 + 2 / 7 * np.sqrt(6 / 5)), np.sqrt(3 / 7 - 2 / 7 * np.sqrt(6 / 5))
    two, weights = gaussian_latitudes(2)
    expected = np.degrees(np.arcsin([outer, inner, -inner, -outer]))
    np.testing.assert_allclose(two, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(weights.sum(), 2.0, rtol=1e-14)
    lat96, _ = gaussian_latitudes(96)
    assert np.all(np.diff(lat96) < 0) and np.allclose(lat96, -lat96[::-1], atol=1e-12) and 89 < lat96[0] < 90


@pytest.mark.parametrize("name", ["O1", "O24", "O96", "45x90"])
def test_areas_cover_the_sphere(name: str) -> None:
    grid = grid_from_name(name)
    np.testing.assert_allclose(grid.areas.sum(), 4 * np.pi, rtol=1e-12)
    assert grid.latitudes.shape == grid.longitudes.shape == grid.areas.shape
    assert np.all((grid.longitudes >= 0) & (grid.longitudes < 360)) and np.all(grid.areas > 0)


def test_octahedral_rows_start_at_greenwich_and_widen_towards_the_equator() -> None:
    grid = octahedral_grid(3)
    sizes = octahedral_row_sizes(3)
    assert sizes.tolist() == [20, 24, 28, 28, 24, 20]
    first_row = grid.longitudes[:20]
    np.testing.assert_allclose(first_row, np.arange(20) * 18.0)
    # the area of a point shrinks towards the poles along with its row's band
    assert grid.areas[0] < grid.areas[-(20 + 24 + 28) - 1]


def test_a_bad_grid_name_says_what_is_expected() -> None:
    with pytest.raises(ValueError, match=r"grid 'N320': expected O<N>"):
        grid_from_name("N320")
    with pytest.raises(ValueError, match="needs N >= 1"):
        grid_from_name("O0")

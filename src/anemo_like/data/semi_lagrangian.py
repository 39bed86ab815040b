"""Semi-Lagrangian advection on a cell-centred n_lat x n_lon lat/lon grid (rows north to south, columns from 0°):
departure points of trajectories on the sphere and cubic Lagrange interpolation across the poles and the date line.

Used by the quasi-geostrophic atmosphere (:mod:`anemo_like.data.quasi_geostrophic`) that generates the built-in data.
"""

from __future__ import annotations

import numpy as np


class SemiLagrangian:
    """Departure points on the sphere and cubic Lagrange interpolation across the poles and the date line."""

    _PAD = 3

    def __init__(self, *, phi: np.ndarray, lam: np.ndarray, radius: float) -> None:
        """phi: (n_lat,) row latitudes, radians, north to south; lam: (n_lon,) column longitudes from 0, radians;
        radius: of the sphere, m."""
        self.n_lat, self.n_lon = len(phi), len(lam)
        self.radius = radius
        phi2, lam2 = np.meshgrid(phi, lam, indexing="ij")
        self.points = np.stack([np.cos(phi2) * np.cos(lam2), np.cos(phi2) * np.sin(lam2), np.sin(phi2)]).reshape(3, -1)
        self.east = np.stack([-np.sin(lam2), np.cos(lam2), np.zeros_like(lam2)]).reshape(3, -1)
        self.north = np.stack([-np.sin(phi2) * np.cos(lam2), -np.sin(phi2) * np.sin(lam2), np.cos(phi2)]).reshape(3, -1)
        self.dphi, self.dlam = np.pi / self.n_lat, 2 * np.pi / self.n_lon
        # grid index of every point of a grid padded by rows beyond the poles and columns beyond the date line
        index = np.arange(self.n_lat * self.n_lon).reshape(self.n_lat, self.n_lon)
        beyond = np.roll(index, self.n_lon // 2, axis=1)
        p = self._PAD
        rows = np.concatenate([beyond[p - 1 :: -1], index, beyond[: -p - 1 : -1]])
        self.padded_index = np.concatenate([rows[:, -p:], rows, rows[:, :p]], axis=1)
        self._tables: dict[int, np.ndarray] = {}

    def _stencil(self, r: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Stencil at unit vectors r (layers, 3, N) for Lagrange interpolation of order 1 or 3.

        Returns flat indices into the stacked layer grids ((order+1)², layers*N) and the row and column weights
        ((order+1), layers*N).
        """
        n_layers = r.shape[0]
        lat = np.arcsin(np.clip(r[:, 2], -1.0, 1.0)).ravel()
        lon = np.mod(np.arctan2(r[:, 1], r[:, 0]), 2 * np.pi).ravel()
        row = (np.pi / 2 - lat) / self.dphi - 0.5 + self._PAD
        col = lon / self.dlam + self._PAD
        first = 0 if order == 1 else 1
        i0, j0 = np.floor(row).astype(np.intp) - first, np.floor(col).astype(np.intp) - first
        height, width = self.padded_index.shape
        k = np.arange(order + 1)
        offsets = (k[:, None] * width + k[None, :]).reshape(-1, 1)
        corner = np.repeat(np.arange(n_layers) * height * width, self.n_lat * self.n_lon) + i0 * width + j0
        index = np.take(self._layer_tables(n_layers), corner + offsets)
        return index, _lagrange_weights(row - i0 - first, order), _lagrange_weights(col - j0 - first, order)

    def _layer_tables(self, n_layers: int) -> np.ndarray:
        """Flat indices into n_layers stacked grids of every point of the layers' padded grids."""
        if n_layers not in self._tables:
            layers = np.arange(n_layers)[:, None, None] * self.n_lat * self.n_lon
            self._tables[n_layers] = (self.padded_index[None] + layers).ravel()
        return self._tables[n_layers]

    @staticmethod
    def interpolate(fields: np.ndarray, stencil: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
        """Fields (C, layers, ...grid) sampled with a stencil -> (C, layers * N)."""
        index, row_weights, col_weights = stencil
        size = len(row_weights)
        values = np.take(fields.reshape(fields.shape[0], -1), index, axis=1)
        values = values.reshape(fields.shape[0], size, size, -1)
        return np.einsum("cabn,an,bn->cn", values, row_weights, col_weights)

    def departure(self, u: np.ndarray, v: np.ndarray, dt: float) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
        """Cubic stencil at the departure points of trajectories that arrive at the grid after dt seconds, and the
        sine of the departure latitudes (layers, n_lat, n_lon).

        u, v: (layers, n_lat, n_lon) m/s. Midpoint iterated twice with the velocity (as a 3-D vector) interpolated
        linearly; the departure point is the midpoint reflected through the arrival point on the great circle.
        """
        n_layers = u.shape[0]
        velocity = u.reshape(n_layers, 1, -1) * self.east + v.reshape(n_layers, 1, -1) * self.north
        by_component = velocity.transpose(1, 0, 2)  # (3, layers, N)
        mid_velocity = velocity
        for _ in range(2):
            mid = self.points - 0.5 * dt / self.radius * mid_velocity
            mid /= np.linalg.norm(mid, axis=1, keepdims=True)
            sampled = self.interpolate(by_component, self._stencil(mid, order=1))
            mid_velocity = sampled.reshape(3, n_layers, -1).transpose(1, 0, 2)
        departure = 2 * np.sum(self.points * mid, axis=1, keepdims=True) * mid - self.points
        return self._stencil(departure, order=3), departure[:, 2].reshape(u.shape)


def _lagrange_weights(t: np.ndarray, order: int) -> np.ndarray:
    """Weights (order+1, ...) of Lagrange interpolation at fraction t past node 0 (linear) or node 1 (cubic)."""
    if order == 1:
        return np.stack([1 - t, t])
    return np.stack(
        [
            -t * (t - 1) * (t - 2) / 6,
            (t + 1) * (t - 1) * (t - 2) / 2,
            -(t + 1) * t * (t - 2) / 2,
            (t + 1) * t * (t - 1) / 6,
        ]
    )

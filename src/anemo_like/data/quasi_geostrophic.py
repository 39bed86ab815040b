"""The forced two-layer quasi-geostrophic atmosphere that generates the built-in dataset (32 x 64 lat/lon grid).

Potential vorticity of an upper (~250 hPa) and a lower (~850 hPa) layer is advected semi-Lagrangianly on the sphere
(three-time-level scheme, 3-h step, cubic interpolation) by the layer's own wind. Thermal relaxation towards a
baroclinic equilibrium (jets at 45°, a zonal wavenumber-2 pattern in the north), Ekman drag on the lower layer and
hyperdiffusion keep a stationary climate of travelling, growing and decaying baroclinic eddies. Every stored variable
is a linear function of the two streamfunctions (winds; z_500, sp by linear balance; t_850 by thermal wind), so the
next 6-h state is a deterministic, local function of the last one or two. :func:`simulate` takes ~10 s on one core.
"""

from __future__ import annotations

import numpy as np

from anemo_like.progress import Progress

N_LAT, N_LON = 32, 64
N_DATES = 1460  # 365 days, 6-hourly
FREQUENCY_HOURS = 6
UNITS = {
    "sp": "Pa",
    "t_850": "K",
    "u_250": "m s**-1",
    "u_850": "m s**-1",
    "v_250": "m s**-1",
    "v_850": "m s**-1",
    "z_500": "m**2 s**-2",
}
PROGNOSTIC = tuple(UNITS)

# planet and diagnostics
_RADIUS = 6.371e6  # m
_OMEGA = 7.292e-5  # 1/s
_Z500_MEAN = 54_900.0  # m²/s²
_T850_MEAN = 276.0  # K
_THICKNESS_PER_KELVIN = 287.0 * np.log(4.0)  # R_dry ln(1000/250), m²/s²/K
_SP_MEAN = 100_000.0  # Pa
_RHO_LOW = 1.1  # kg/m³, converts lower-layer geopotential to surface pressure

# dynamics
_STEP_SECONDS = 3 * 3600
_SPIN_UP_DAYS = 30
_DEFORMATION_RADIUS = 5.0e5  # m
_SHEAR_SPEED = 25.0  # m/s, peak of the equilibrium half shear (u_250 - u_850) / 2
_THERMAL_DAYS = 5.0
_EKMAN_DAYS = 1.0
_HYPERDIFFUSION_HOURS = 6.0  # e-folding time at zonal wavenumber 32 on the equator
_WAVE_STREAMFUNCTION = 1.0e7  # m²/s, zonal wavenumber-2 part of the northern equilibrium, as land and sea would
_ASSELIN = 0.05
_INITIAL_NOISE = 1.0e6  # m²/s, streamfunction perturbation


# Ranges (min, max) outside which a stored variable means the simulation went wrong; the seeds' climates stay well
# inside (sp 89-111 kPa, z_500 3.6-6.5e4 m²/s², t_850 225-293 K, |winds| < 115 m/s).
PHYSICAL_RANGES = {
    "sp": (7.0e4, 1.3e5),
    "t_850": (150.0, 350.0),
    "u_250": (-200.0, 200.0),
    "u_850": (-200.0, 200.0),
    "v_250": (-200.0, 200.0),
    "v_850": (-200.0, 200.0),
    "z_500": (2.0e4, 8.0e4),
}


def inverse_laplacian(lap: np.ndarray) -> np.ndarray:
    """Inverses (M, N_LAT, N_LAT) of the per-wavenumber Laplacians (M, N_LAT, N_LAT); for m = 0 the pseudo-inverse.

    The zonal-mean (m = 0) Laplacian is singular: with no flux through the poles it maps constants to zero. In floating
    point its smallest singular value is rounding noise (~1e-17 of the largest with numpy 2.4 here, but anywhere up to
    ~N_LAT * eps ~ 7e-15 with another numpy, libm or LAPACK), while the next one is ~4e-3 of the largest. A relative
    cutoff such as ``np.linalg.pinv``'s default 1e-15 lies inside that noise: where the noise lands above it, the
    inverse keeps 1 / (noise) ~ 1e25 along the constants, and the linear balance built on it (sp, z_500) amplifies
    rounding errors to ~1e12 (as in a dataset generated with numpy 2.5.2). So the null mode is dropped by its index,
    not by a threshold; where the noise lies below 1e-15, the result is bit-identical to ``np.linalg.pinv``'s.
    """
    u, singular, vt = np.linalg.svd(lap[0])
    if not singular[-2] > 1e-6 * singular[0] > singular[-1]:
        raise RuntimeError(f"the zonal-mean Laplacian should have exactly one null mode; singular values {singular}")
    inverse_singular = 1.0 / singular
    inverse_singular[-1] = 0.0  # the constants, whatever rounding made of their singular value
    zonal_mean = vt.T @ (inverse_singular[:, None] * u.T)
    return np.concatenate([zonal_mean[None], np.linalg.inv(lap[1:])])


def check_physical(values: np.ndarray, *, what: str) -> None:
    """Raise RuntimeError if variables (..., len(PROGNOSTIC), grid) are not finite or leave :data:`PHYSICAL_RANGES`."""
    problems = []
    for i, name in enumerate(PROGNOSTIC):
        field = values[..., i, :]
        low, high = PHYSICAL_RANGES[name]
        if not np.isfinite(field).all():
            problems.append(f"{name} is not finite")
        elif field.min() < low or field.max() > high:
            problems.append(f"{name} spans [{field.min():.4g}, {field.max():.4g}], outside [{low:.4g}, {high:.4g}]")
    if problems:
        raise RuntimeError(f"{what} is unphysical: {'; '.join(problems)}; please report this")


class _Sphere:
    """Finite differences in latitude, Fourier in longitude; spectral arrays are (..., zonal wavenumber, latitude)."""

    def __init__(self) -> None:
        self.phi = np.deg2rad(90.0 - (np.arange(N_LAT) + 0.5) * 180.0 / N_LAT)
        self.lam = np.arange(N_LON) * 2 * np.pi / N_LON
        self.dphi = np.pi / N_LAT
        self.m = np.arange(N_LON // 2 + 1)
        self.area = np.repeat(np.cos(self.phi) / np.cos(self.phi).sum() / N_LON, N_LON).reshape(N_LAT, N_LON)
        self.lap = self._laplacian()
        self.inv_lap = inverse_laplacian(self.lap)
        self.ddphi = self._ddphi()
        coriolis = 2 * _OMEGA * np.sin(self.phi)
        beta_term = 2 * _OMEGA * np.cos(self.phi) / _RADIUS**2
        # linear balance: laplacian(Phi) = div(f grad psi) = f laplacian(psi) + f_phi psi_phi / a²
        self.balance = self.inv_lap @ (coriolis[:, None] * self.lap + beta_term[:, None] * self.ddphi)

    def _laplacian(self) -> np.ndarray:
        """(M, N_LAT, N_LAT) spherical Laplacian per zonal wavenumber, 1/m²; no flux through the poles."""
        cos_centre = np.cos(self.phi)
        cos_edge = np.cos(np.deg2rad(90.0 - np.arange(N_LAT + 1) * 180.0 / N_LAT))
        cos_edge[[0, -1]] = 0.0
        flux = np.diag(-(cos_edge[:-1] + cos_edge[1:])) + np.diag(cos_edge[1:-1], 1) + np.diag(cos_edge[1:-1], -1)
        meridional = flux / (cos_centre[:, None] * self.dphi**2)
        zonal = self.m[:, None, None] ** 2 * np.diag(1.0 / cos_centre**2)[None]
        return (meridional[None] - zonal) / _RADIUS**2

    def _ddphi(self) -> np.ndarray:
        """(M, N_LAT, N_LAT) centred d/dphi; the row beyond a pole is the first row shifted by 180° ((-1)^m)."""
        d = (np.diag(np.ones(N_LAT - 1), -1) - np.diag(np.ones(N_LAT - 1), 1)) / (2 * self.dphi)
        d = np.repeat(d[None], len(self.m), axis=0)
        sign = (-1.0) ** self.m / (2 * self.dphi)
        d[:, 0, 0] += sign
        d[:, -1, -1] -= sign
        return d

    @staticmethod
    def spec(field: np.ndarray) -> np.ndarray:
        return np.fft.rfft(field, axis=-1).swapaxes(-1, -2)

    @staticmethod
    def grid(spectral: np.ndarray) -> np.ndarray:
        return np.fft.irfft(spectral.swapaxes(-1, -2), n=N_LON, axis=-1)

    @staticmethod
    def apply(matrices: np.ndarray, spectral: np.ndarray) -> np.ndarray:
        """Per-wavenumber matrices (M, N_LAT, N_LAT) applied to spectral (..., M, N_LAT)."""
        return (matrices @ spectral[..., None])[..., 0]

    def wind(self, psi_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Grid u = -psi_phi / a and v = psi_lambda / (a cos phi), m/s, from a spectral streamfunction."""
        u = -self.apply(self.ddphi, psi_hat) / _RADIUS
        v = 1j * self.m[:, None] * psi_hat / (_RADIUS * np.cos(self.phi))
        return self.grid(u), self.grid(v)


class _SemiLagrangian:
    """Departure points on the sphere and cubic Lagrange interpolation across the poles and the date line."""

    _PAD = 3

    def __init__(self, sphere: _Sphere) -> None:
        phi, lam = np.meshgrid(sphere.phi, sphere.lam, indexing="ij")
        self.points = np.stack([np.cos(phi) * np.cos(lam), np.cos(phi) * np.sin(lam), np.sin(phi)]).reshape(3, -1)
        self.east = np.stack([-np.sin(lam), np.cos(lam), np.zeros_like(lam)]).reshape(3, -1)
        self.north = np.stack([-np.sin(phi) * np.cos(lam), -np.sin(phi) * np.sin(lam), np.cos(phi)]).reshape(3, -1)
        self.dphi, self.dlam = sphere.dphi, 2 * np.pi / N_LON
        # grid index of every point of a grid padded by rows beyond the poles and columns beyond the date line
        index = np.arange(N_LAT * N_LON).reshape(N_LAT, N_LON)
        beyond = np.roll(index, N_LON // 2, axis=1)
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
        corner = np.repeat(np.arange(n_layers) * height * width, N_LAT * N_LON) + i0 * width + j0
        index = np.take(self._layer_tables(n_layers), corner + offsets)
        return index, _lagrange_weights(row - i0 - first, order), _lagrange_weights(col - j0 - first, order)

    def _layer_tables(self, n_layers: int) -> np.ndarray:
        """Flat indices into n_layers stacked grids of every point of the layers' padded grids."""
        if n_layers not in self._tables:
            layers = np.arange(n_layers)[:, None, None] * N_LAT * N_LON
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
        sine of the departure latitudes (layers, N_LAT, N_LON).

        u, v: (layers, N_LAT, N_LON) m/s. Midpoint iterated twice with the velocity (as a 3-D vector) interpolated
        linearly; the departure point is the midpoint reflected through the arrival point on the great circle.
        """
        n_layers = u.shape[0]
        velocity = u.reshape(n_layers, 1, -1) * self.east + v.reshape(n_layers, 1, -1) * self.north
        by_component = velocity.transpose(1, 0, 2)  # (3, layers, N)
        mid_velocity = velocity
        for _ in range(2):
            mid = self.points - 0.5 * dt / _RADIUS * mid_velocity
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


class _TwoLayerModel:
    """Two-layer QG potential vorticity q (2, N_LAT, N_LON), 1/s, stepped with leapfrog semi-Lagrangian advection."""

    def __init__(self, sphere: _Sphere) -> None:
        self.sphere = sphere
        self.advection = _SemiLagrangian(sphere)
        phi, lam = np.meshgrid(sphere.phi, sphere.lam, indexing="ij")
        self.coriolis = 2 * _OMEGA * np.sin(phi)
        self.stretch = 1.0 / _DEFORMATION_RADIUS**2
        identity = np.eye(N_LAT)[None]
        self.inv_baroclinic = np.linalg.inv(sphere.lap - 2 * self.stretch * identity)
        rate = 1.0 / ((32 / _RADIUS) ** 4 * _HYPERDIFFUSION_HOURS * 3600)
        self.hyperdiffusion = np.linalg.inv(identity + 2 * _STEP_SECONDS * rate * (sphere.lap @ sphere.lap))
        shear = _SHEAR_SPEED * np.sin(2 * sphere.phi) ** 2  # half shear, m/s
        waves = _WAVE_STREAMFUNCTION * np.exp(-(((phi - np.pi / 4) / 0.3) ** 2)) * np.cos(2 * lam)
        self.baroclinic_eq = self._zonal_streamfunction(shear) + waves
        # angular momentum fixer: barotropic relative angular momentum is a linear functional of the zonal-mean
        # barotropic vorticity; a solid-body rotation restores it after each (non-conservative) interpolation
        weights = np.cos(sphere.phi) ** 2 / np.sum(np.cos(sphere.phi) ** 2)
        self.momentum_functional = -(weights @ sphere.ddphi[0] @ sphere.inv_lap[0]) / _RADIUS
        self.solid_body = sphere.lap[0] @ (-_RADIUS * np.sin(sphere.phi))  # vorticity of u = cos(lat) m/s
        self.solid_body_momentum = self.momentum_functional @ self.solid_body

    def _zonal_streamfunction(self, u: np.ndarray) -> np.ndarray:
        """Streamfunction (N_LAT, N_LON), m²/s, of a zonal wind u(lat) with zero area mean."""
        # integrate d(psi)/d(phi) = -a u northwards from the south pole (latitudes are stored north to south)
        increments = -_RADIUS * u[::-1] * self.sphere.dphi
        psi = (np.cumsum(increments) - 0.5 * increments)[::-1]
        psi = np.repeat(psi[:, None], N_LON, axis=1)
        return psi - np.sum(self.sphere.area * psi)

    def streamfunctions(self, q: np.ndarray) -> np.ndarray:
        """Spectral barotropic and baroclinic streamfunctions (..., 2, M, N_LAT) from PV (..., 2, N_LAT, N_LON)."""
        anomaly = self.sphere.spec(q - self.coriolis)
        barotropic = self.sphere.apply(self.sphere.inv_lap, (anomaly[..., 0, :, :] + anomaly[..., 1, :, :]) / 2)
        baroclinic = self.sphere.apply(self.inv_baroclinic, (anomaly[..., 0, :, :] - anomaly[..., 1, :, :]) / 2)
        return np.stack([barotropic, baroclinic], axis=-3)

    def potential_vorticity(self, barotropic: np.ndarray, baroclinic: np.ndarray) -> np.ndarray:
        """PV (2, N_LAT, N_LON) of grid streamfunctions."""
        layers = self.sphere.spec(np.stack([barotropic + baroclinic, barotropic - baroclinic]))
        vorticity = self.sphere.grid(self.sphere.apply(self.sphere.lap, layers))
        stretching = 2 * self.stretch * baroclinic
        return vorticity + np.stack([-stretching, stretching]) + self.coriolis

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """PV of the equilibrium shear plus smooth seeded noise in both modes."""
        coefficients = rng.standard_normal((2, N_LAT, 8)) + 1j * rng.standard_normal((2, N_LAT, 8))
        noise = np.fft.irfft(coefficients, n=N_LON, axis=-1) * np.cos(self.sphere.phi)[:, None]
        noise *= _INITIAL_NOISE / np.abs(noise).max()
        return self.potential_vorticity(noise[0], self.baroclinic_eq + noise[1])

    def step(self, previous: np.ndarray, current: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One leapfrog step: (q at n-1, q at n) -> (filtered q at n, q at n+1).

        q_k = zeta_k + f -/+ 2F psi_bc. Relative vorticity moves with the layer's wind, f is evaluated exactly at the
        departure point and the stretching term moves with the barotropic wind (exact, as J(psi_bc, psi_bc) = 0), so
        the layers' stretching terms cancel; a solid-body rotation then removes the angular momentum that the
        interpolation creates, leaving Ekman drag as the only sink.
        """
        psi_hat = self.streamfunctions(np.stack([current, previous]))
        barotropic, baroclinic = psi_hat[0]
        u, v = self.sphere.wind(np.stack([barotropic + baroclinic, barotropic - baroclinic, barotropic]))
        stencil, sin_departure = self.advection.departure(u, v, 2 * _STEP_SECONDS)
        baroclinic_prev = self.sphere.grid(psi_hat[1, 1])
        stretching = 2 * self.stretch * baroclinic_prev
        vorticity = previous - self.coriolis + np.stack([stretching, -stretching])  # (2, N_LAT, N_LON) at n-1
        sampled = self.advection.interpolate(np.concatenate([vorticity, baroclinic_prev[None]])[None], stencil)
        sampled = sampled.reshape(3, N_LAT, N_LON)
        stretching_advected = 2 * self.stretch * sampled[2]
        advected = sampled[:2] + 2 * _OMEGA * sin_departure[:2] + np.stack([-stretching_advected, stretching_advected])
        missing = self._momentum(previous - self.coriolis) - self._momentum(advected - self.coriolis)
        advected += missing / self.solid_body_momentum * self.solid_body[:, None]
        # damping evaluated at n-1, as leapfrog requires
        thermal = 2 * self.stretch * (baroclinic_prev - self.baroclinic_eq) / (_THERMAL_DAYS * 86400)
        drag = vorticity[1] / (_EKMAN_DAYS * 86400)
        advected += 2 * _STEP_SECONDS * np.stack([thermal, -thermal - drag])
        anomaly = self.sphere.grid(self.sphere.apply(self.hyperdiffusion, self.sphere.spec(advected - self.coriolis)))
        following = anomaly + self.coriolis
        filtered = current + _ASSELIN * (following - 2 * current + previous)
        return filtered, following

    def _momentum(self, vorticity: np.ndarray) -> float:
        """Barotropic relative angular momentum (cos²-weighted mean zonal wind, m/s) of layer vorticities (2, ...)."""
        return float(self.momentum_functional @ vorticity.mean(axis=(0, -1)))

    def variables(self, q: np.ndarray) -> np.ndarray:
        """Stored variables (..., len(PROGNOSTIC), N_LAT * N_LON) of states q (..., 2, N_LAT, N_LON), physical units."""
        sphere = self.sphere
        psi_hat = self.streamfunctions(q)
        barotropic, baroclinic = psi_hat[..., 0, :, :], psi_hat[..., 1, :, :]
        upper, lower = barotropic + baroclinic, barotropic - baroclinic

        def geopotential(psi: np.ndarray) -> np.ndarray:
            phi = sphere.grid(sphere.apply(sphere.balance, psi))
            return phi - np.sum(sphere.area * phi, axis=(-2, -1), keepdims=True)

        u_250, v_250 = sphere.wind(upper)
        u_850, v_850 = sphere.wind(lower)
        fields = {
            "sp": _SP_MEAN + _RHO_LOW * geopotential(lower),
            "t_850": _T850_MEAN + geopotential(upper - lower) / _THICKNESS_PER_KELVIN,
            "u_250": u_250,
            "u_850": u_850,
            "v_250": v_250,
            "v_850": v_850,
            "z_500": _Z500_MEAN + geopotential(barotropic),
        }
        stacked = np.stack([fields[name] for name in PROGNOSTIC], axis=-3)
        return stacked.reshape(*stacked.shape[:-2], N_LAT * N_LON)


def simulate(
    *, seed: int, n_dates: int = N_DATES, spin_up_days: float = _SPIN_UP_DAYS, progress: bool = False
) -> np.ndarray:
    """Prognostic fields (n_dates, len(PROGNOSTIC), N_LAT * N_LON) float32 in physical units, every 6 h after the
    spin-up; ``seed`` sets the initial perturbation; ``progress`` shows the dates done (:mod:`anemo_like.progress`)."""
    model = _TwoLayerModel(_Sphere())
    current = model.initial_state(np.random.default_rng(seed))
    previous = current.copy()
    for _ in range(round(spin_up_days * 86400 / _STEP_SECONDS)):
        previous, current = model.step(previous, current)
    states = np.empty((n_dates, *current.shape))
    with Progress(total=n_dates, desc="built-in dataset", unit="date", enabled=progress) as shown:
        for i in range(n_dates):
            for _ in range(FREQUENCY_HOURS * 3600 // _STEP_SECONDS if i else 0):
                previous, current = model.step(previous, current)
            states[i] = current
            shown.update()
    values = model.variables(states)
    check_physical(values, what=f"built-in dataset simulation (seed {seed})")
    return values.astype(np.float32)

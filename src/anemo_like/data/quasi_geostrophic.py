"""The forced two-layer quasi-geostrophic atmosphere that generates the built-in dataset (32 x 64 lat/lon grid; any
n_lat x 2 n_lat grid for the regional pair, :mod:`anemo_like.data.regional_pair`).

Potential vorticity of an upper (~250 hPa) and a lower (~850 hPa) layer is advected semi-Lagrangianly on the sphere
(three-time-level scheme, 3-h step, cubic interpolation) by the layer's own wind. Thermal relaxation towards a
baroclinic equilibrium (jets at 45°, a zonal wavenumber-2 pattern in the north), Ekman drag on the lower layer and
hyperdiffusion (plus a Laplacian viscosity on grids finer than 32 x 64) keep a stationary climate of travelling,
growing and decaying baroclinic eddies. Every stored variable is a linear function of the two streamfunctions (winds;
z_500, sp by linear balance; t_850 by thermal wind), so the next 6-h state is a deterministic, local function of the
last one or two. :func:`simulate` takes ~10 s on one core at 32 x 64. The semi-Lagrangian advection is in
:mod:`anemo_like.data.semi_lagrangian`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from anemo_like.data.semi_lagrangian import SemiLagrangian
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
_HYPERDIFFUSION_HOURS = 6.0  # e-folding time at the grid's largest zonal wavenumber n_lon / 2 on the equator
# Laplacian viscosity of grids finer than the built-in's, e-folding time at a zonal wavenumber on the equator: on the
# 32 x 64 grid the interpolation of the advection damps the synoptic scales; finer grids lose that damping and their
# eddies grow ~4x stronger (v_250 std 41-44 m/s instead of 11 m/s in northern mid-latitudes, winds to 200 m/s), which
# this viscosity brings back to the built-in's climate (13-16 m/s at 96 x 192 and 128 x 256)
_VISCOSITY_HOURS, _VISCOSITY_WAVENUMBER = 6.0, 64
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

    def __init__(self, n_lat: int = N_LAT) -> None:
        """A cell-centred n_lat x 2 n_lat grid, rows north to south, columns from 0°."""
        if n_lat < 8 or n_lat % 2:
            raise ValueError(f"the quasi-geostrophic grid needs an even number of latitudes >= 8, got n_lat={n_lat}")
        self.n_lat, self.n_lon = n_lat, 2 * n_lat
        self.phi = np.deg2rad(90.0 - (np.arange(n_lat) + 0.5) * 180.0 / n_lat)
        self.lam = np.arange(self.n_lon) * 2 * np.pi / self.n_lon
        self.dphi = np.pi / n_lat
        self.m = np.arange(self.n_lon // 2 + 1)
        self.area = np.repeat(np.cos(self.phi) / np.cos(self.phi).sum() / self.n_lon, self.n_lon).reshape(
            n_lat, self.n_lon
        )
        self.lap = self._laplacian()
        self.inv_lap = inverse_laplacian(self.lap)
        self.ddphi = self._ddphi()
        coriolis = 2 * _OMEGA * np.sin(self.phi)
        beta_term = 2 * _OMEGA * np.cos(self.phi) / _RADIUS**2
        # linear balance: laplacian(Phi) = div(f grad psi) = f laplacian(psi) + f_phi psi_phi / a²
        self.balance = self.inv_lap @ (coriolis[:, None] * self.lap + beta_term[:, None] * self.ddphi)
        # complex copies of the operators applied to spectral fields (real ones would be cast at every application)
        self.complex_ops = {
            "inv_lap": self.inv_lap.astype(complex),
            "lap": self.lap.astype(complex),
            "ddphi": self.ddphi.astype(complex),
            "balance": self.balance.astype(complex),
        }

    def _laplacian(self) -> np.ndarray:
        """(M, n_lat, n_lat) spherical Laplacian per zonal wavenumber, 1/m²; no flux through the poles."""
        cos_centre = np.cos(self.phi)
        cos_edge = np.cos(np.deg2rad(90.0 - np.arange(self.n_lat + 1) * 180.0 / self.n_lat))
        cos_edge[[0, -1]] = 0.0
        flux = np.diag(-(cos_edge[:-1] + cos_edge[1:])) + np.diag(cos_edge[1:-1], 1) + np.diag(cos_edge[1:-1], -1)
        meridional = flux / (cos_centre[:, None] * self.dphi**2)
        zonal = self.m[:, None, None] ** 2 * np.diag(1.0 / cos_centre**2)[None]
        return (meridional[None] - zonal) / _RADIUS**2

    def _ddphi(self) -> np.ndarray:
        """(M, n_lat, n_lat) centred d/dphi; the row beyond a pole is the first row shifted by 180° ((-1)^m)."""
        d = (np.diag(np.ones(self.n_lat - 1), -1) - np.diag(np.ones(self.n_lat - 1), 1)) / (2 * self.dphi)
        d = np.repeat(d[None], len(self.m), axis=0)
        sign = (-1.0) ** self.m / (2 * self.dphi)
        d[:, 0, 0] += sign
        d[:, -1, -1] -= sign
        return d

    @staticmethod
    def spec(field: np.ndarray) -> np.ndarray:
        return np.fft.rfft(field, axis=-1).swapaxes(-1, -2)

    def grid(self, spectral: np.ndarray) -> np.ndarray:
        return np.fft.irfft(spectral.swapaxes(-1, -2), n=self.n_lon, axis=-1)

    @staticmethod
    def apply(matrices: np.ndarray, spectral: np.ndarray) -> np.ndarray:
        """Per-wavenumber complex matrices (M, n_lat, n_lat) applied to spectral (..., M, n_lat)."""
        return (matrices @ spectral[..., None])[..., 0]

    def wind(self, psi_hat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Grid u = -psi_phi / a and v = psi_lambda / (a cos phi), m/s, from a spectral streamfunction."""
        u = -self.apply(self.complex_ops["ddphi"], psi_hat) / _RADIUS
        v = 1j * self.m[:, None] * psi_hat / (_RADIUS * np.cos(self.phi))
        return self.grid(u), self.grid(v)


def _implicit_diffusion(sphere: _Sphere) -> np.ndarray:
    """(M, n_lat, n_lat) complex inverse of 1 + 2 dt D, where D is the hyperdiffusion (del^4) and, on grids finer than
    the built-in's, the Laplacian viscosity: backward-Euler damping over a leapfrog step of 2 dt."""
    identity = np.eye(sphere.n_lat)[None]
    rate = 1.0 / ((sphere.n_lon // 2 / _RADIUS) ** 4 * _HYPERDIFFUSION_HOURS * 3600)
    damping = 2 * _STEP_SECONDS * rate * (sphere.lap @ sphere.lap)
    if sphere.n_lat > N_LAT:
        viscosity = 1.0 / ((_VISCOSITY_WAVENUMBER / _RADIUS) ** 2 * _VISCOSITY_HOURS * 3600)  # m²/s
        damping -= 2 * _STEP_SECONDS * viscosity * sphere.lap
    return np.linalg.inv(identity + damping).astype(complex)


class _TwoLayerModel:
    """Two-layer QG potential vorticity q (2, n_lat, n_lon), 1/s, stepped with leapfrog semi-Lagrangian advection."""

    def __init__(self, sphere: _Sphere) -> None:
        self.sphere = sphere
        self.advection = SemiLagrangian(phi=sphere.phi, lam=sphere.lam, radius=_RADIUS)
        phi, lam = np.meshgrid(sphere.phi, sphere.lam, indexing="ij")
        self.coriolis = 2 * _OMEGA * np.sin(phi)
        self.stretch = 1.0 / _DEFORMATION_RADIUS**2
        identity = np.eye(sphere.n_lat)[None]
        self.inv_baroclinic = np.linalg.inv(sphere.lap - 2 * self.stretch * identity).astype(complex)
        self.diffusion = _implicit_diffusion(sphere)
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
        """Streamfunction (n_lat, n_lon), m²/s, of a zonal wind u(lat) with zero area mean."""
        # integrate d(psi)/d(phi) = -a u northwards from the south pole (latitudes are stored north to south)
        increments = -_RADIUS * u[::-1] * self.sphere.dphi
        psi = (np.cumsum(increments) - 0.5 * increments)[::-1]
        psi = np.repeat(psi[:, None], self.sphere.n_lon, axis=1)
        return psi - np.sum(self.sphere.area * psi)

    def streamfunctions(self, q: np.ndarray) -> np.ndarray:
        """Spectral barotropic and baroclinic streamfunctions (..., 2, M, n_lat) from PV (..., 2, n_lat, n_lon)."""
        anomaly = self.sphere.spec(q - self.coriolis)
        barotropic = self.sphere.apply(
            self.sphere.complex_ops["inv_lap"], (anomaly[..., 0, :, :] + anomaly[..., 1, :, :]) / 2
        )
        baroclinic = self.sphere.apply(self.inv_baroclinic, (anomaly[..., 0, :, :] - anomaly[..., 1, :, :]) / 2)
        return np.stack([barotropic, baroclinic], axis=-3)

    def potential_vorticity(self, barotropic: np.ndarray, baroclinic: np.ndarray) -> np.ndarray:
        """PV (2, n_lat, n_lon) of grid streamfunctions."""
        layers = self.sphere.spec(np.stack([barotropic + baroclinic, barotropic - baroclinic]))
        vorticity = self.sphere.grid(self.sphere.apply(self.sphere.complex_ops["lap"], layers))
        stretching = 2 * self.stretch * baroclinic
        return vorticity + np.stack([-stretching, stretching]) + self.coriolis

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """PV of the equilibrium shear plus smooth seeded noise in both modes."""
        shape = (2, self.sphere.n_lat, 8)
        coefficients = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
        noise = np.fft.irfft(coefficients, n=self.sphere.n_lon, axis=-1) * np.cos(self.sphere.phi)[:, None]
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
        vorticity = previous - self.coriolis + np.stack([stretching, -stretching])  # (2, n_lat, n_lon) at n-1
        sampled = self.advection.interpolate(np.concatenate([vorticity, baroclinic_prev[None]])[None], stencil)
        sampled = sampled.reshape(3, *current.shape[-2:])
        stretching_advected = 2 * self.stretch * sampled[2]
        advected = sampled[:2] + 2 * _OMEGA * sin_departure[:2] + np.stack([-stretching_advected, stretching_advected])
        missing = self._momentum(previous - self.coriolis) - self._momentum(advected - self.coriolis)
        advected += missing / self.solid_body_momentum * self.solid_body[:, None]
        # damping evaluated at n-1, as leapfrog requires
        thermal = 2 * self.stretch * (baroclinic_prev - self.baroclinic_eq) / (_THERMAL_DAYS * 86400)
        drag = vorticity[1] / (_EKMAN_DAYS * 86400)
        advected += 2 * _STEP_SECONDS * np.stack([thermal, -thermal - drag])
        anomaly = self.sphere.grid(self.sphere.apply(self.diffusion, self.sphere.spec(advected - self.coriolis)))
        following = anomaly + self.coriolis
        filtered = current + _ASSELIN * (following - 2 * current + previous)
        return filtered, following

    def _momentum(self, vorticity: np.ndarray) -> float:
        """Barotropic relative angular momentum (cos²-weighted mean zonal wind, m/s) of layer vorticities (2, ...)."""
        return float(self.momentum_functional @ vorticity.mean(axis=(0, -1)))

    def variables(self, q: np.ndarray) -> np.ndarray:
        """Stored variables (..., len(PROGNOSTIC), n_lat * n_lon) of states q (..., 2, n_lat, n_lon), physical units."""
        sphere = self.sphere
        psi_hat = self.streamfunctions(q)
        barotropic, baroclinic = psi_hat[..., 0, :, :], psi_hat[..., 1, :, :]
        upper, lower = barotropic + baroclinic, barotropic - baroclinic

        def geopotential(psi: np.ndarray) -> np.ndarray:
            phi = sphere.grid(sphere.apply(sphere.complex_ops["balance"], psi))
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
        return stacked.reshape(*stacked.shape[:-2], -1)


def simulate(
    *,
    seed: int,
    n_dates: int = N_DATES,
    n_lat: int = N_LAT,
    spin_up_days: float = _SPIN_UP_DAYS,
    progress: bool = False,
) -> np.ndarray:
    """Prognostic fields (n_dates, len(PROGNOSTIC), n_lat * 2 n_lat) float32 in physical units, every 6 h after the
    spin-up, on a cell-centred n_lat x 2 n_lat grid (rows north to south); ``seed`` sets the initial perturbation;
    ``progress`` shows the dates done (:mod:`anemo_like.progress`)."""
    chunks = simulate_in_chunks(
        seed=seed, n_dates=n_dates, n_lat=n_lat, spin_up_days=spin_up_days, chunk_dates=n_dates, progress=progress
    )
    return np.concatenate(list(chunks))


def simulate_in_chunks(
    *,
    seed: int,
    n_dates: int,
    chunk_dates: int,
    n_lat: int = N_LAT,
    spin_up_days: float = _SPIN_UP_DAYS,
    progress: bool = False,
) -> Iterator[np.ndarray]:
    """:func:`simulate`'s fields in consecutive chunks of ``chunk_dates`` dates (the last may be shorter), each
    (dates, len(PROGNOSTIC), n_lat * 2 n_lat) float32 and checked to be physical: a long high-resolution run without
    holding all its fields in memory."""
    if n_dates < 1 or chunk_dates < 1:
        raise ValueError(f"n_dates and chunk_dates must be positive, got {n_dates} and {chunk_dates}")
    model = _TwoLayerModel(_Sphere(n_lat))
    current = model.initial_state(np.random.default_rng(seed))
    previous = current.copy()
    spin_up = round(spin_up_days * 86400 / _STEP_SECONDS)
    with Progress(total=spin_up, desc="spin-up", unit="step", enabled=progress and spin_up > 0) as shown:
        for _ in range(spin_up):
            previous, current = model.step(previous, current)
            shown.update()
    what = f"built-in dataset simulation (seed {seed}, {n_lat} x {2 * n_lat} grid)"
    with Progress(total=n_dates, desc="built-in dataset", unit="date", enabled=progress) as shown:
        for first in range(0, n_dates, chunk_dates):
            states = np.empty((min(chunk_dates, n_dates - first), *current.shape))
            for i in range(len(states)):
                for _ in range(FREQUENCY_HOURS * 3600 // _STEP_SECONDS if first + i else 0):
                    previous, current = model.step(previous, current)
                states[i] = current
                shown.update()
            values = model.variables(states)
            check_physical(values, what=what)
            yield values.astype(np.float32)

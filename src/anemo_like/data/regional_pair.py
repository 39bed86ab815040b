"""A consistent pair of synthetic datasets for regional forecasting, from one high-resolution run of the built-in
atmosphere (:mod:`anemo_like.data.quasi_geostrophic`): the points of a European box at full resolution (the region)
and the whole globe coarsened to the built-in 32 x 64 grid (the global).

Both are anemoi-datasets zarrs with the built-in dataset's variables, units, dates and stored precision
(:mod:`anemo_like.data.builtin`), generated once into the cache folder. By default the run is 128 x 256 (1.4°) for 240
days after a 10-day spin-up: 1075 regional points (25 rows x 43 columns) and 2048 global ones, ~260 s on one core
(OMP_NUM_THREADS=1). Bilinear interpolation of the global store to the regional points misses 3-4% of the regional
stdev of z_500 and t_850, 6% of sp's, 12-19% of the winds'.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np

from anemo_like.data import builtin
from anemo_like.data.quasi_geostrophic import simulate_in_chunks
from anemo_like.data.zarr_writer import write_anemoi_zarr

LOG = logging.getLogger(__name__)

REGION_NAME = "builtin-region"
GLOBAL_NAME = "builtin-global"
PAIR_NAME = "builtin-regional-v1"  # bump when the generator changes
REGION_BOX = ((35.0, 70.0), (-20.0, 40.0))  # (south, north) latitudes and (west, east) longitudes, degrees
N_LAT = 128  # rows of the high-resolution run (n_lat x 2 n_lat); the built-in grid has 32
N_DATES = 960  # 240 days, 6-hourly
SPIN_UP_DAYS = 10.0
_CHUNK_DATES = 40  # dates simulated at a time (the high-resolution fields of a chunk, ~70 MB at 128 x 256)


def high_resolution_grid(n_lat: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centred row latitudes (n_lat,), north to south, and column longitudes (2 n_lat,) from 0, degrees."""
    return 90.0 - (np.arange(n_lat) + 0.5) * 180.0 / n_lat, np.arange(2 * n_lat) * 180.0 / n_lat


def region_indices(n_lat: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows (north to south) and columns (west to east) of the n_lat x 2 n_lat grid inside :data:`REGION_BOX`."""
    lat, lon = high_resolution_grid(n_lat)
    (south, north), (west, east) = REGION_BOX
    rows = np.flatnonzero((lat >= south) & (lat <= north))
    signed = (lon + 180.0) % 360.0 - 180.0
    columns = np.flatnonzero((signed >= west) & (signed <= east))
    return rows, columns[np.argsort(signed[columns], kind="stable")]


def coarsening_weights(n_lat: int) -> tuple[np.ndarray, np.ndarray]:
    """Weights of the area mean of an n_lat x 2 n_lat grid over the cells of the built-in 32 x 64 grid.

    Returns row weights (32, n_lat) and column weights (2 n_lat, 64), each summing to one per coarse cell. Rows nest
    exactly (f = n_lat / 32 fine rows per coarse row), weighted by cos(latitude), i.e. by cell area. Columns are
    centred on the points' longitudes from 0°, so for even f the two fine columns on a coarse cell's edges count half.
    """
    factor, remainder = divmod(n_lat, builtin.N_LAT)
    if remainder or factor < 1:
        raise ValueError(f"n_lat must be a positive multiple of {builtin.N_LAT} (the built-in grid), got {n_lat}")
    lat, _ = high_resolution_grid(n_lat)
    area = np.cos(np.deg2rad(lat)).reshape(builtin.N_LAT, factor)
    rows = np.zeros((builtin.N_LAT, n_lat))
    for i in range(builtin.N_LAT):
        rows[i, i * factor : (i + 1) * factor] = area[i] / area[i].sum()
    offsets = np.arange(-(factor // 2) - 1, factor // 2 + 2)
    overlap = np.clip(np.minimum(offsets + 0.5, factor / 2) - np.maximum(offsets - 0.5, -factor / 2), 0.0, 1.0)
    columns = np.zeros((2 * n_lat, builtin.N_LON))
    for j in range(builtin.N_LON):
        columns[(j * factor + offsets) % (2 * n_lat), j] += overlap / factor
    return rows, columns


def write_regional_pair(
    folder: str | Path,
    *,
    seed: int,
    n_dates: int = N_DATES,
    n_lat: int = N_LAT,
    spin_up_days: float = SPIN_UP_DAYS,
    progress: bool = False,
) -> tuple[Path, Path]:
    """Simulate the atmosphere on an n_lat x 2 n_lat grid for ``n_dates`` 6-hourly dates and write
    ``folder/REGION_NAME.zarr`` and ``folder/GLOBAL_NAME.zarr`` (neither may exist); returns their paths.

    ``seed`` sets the initial perturbation; ``progress`` shows the simulated dates (:mod:`anemo_like.progress`).
    """
    rows, columns = region_indices(n_lat)
    row_weights, column_weights = coarsening_weights(n_lat)
    region, coarse = [], []
    chunks = simulate_in_chunks(
        seed=seed, n_dates=n_dates, n_lat=n_lat, spin_up_days=spin_up_days, chunk_dates=_CHUNK_DATES, progress=progress
    )
    for values in chunks:
        fields = values.astype(np.float64).reshape(*values.shape[:2], n_lat, 2 * n_lat)
        region.append(fields[:, :, rows][..., columns].reshape(*values.shape[:2], -1))
        coarse.append((row_weights @ fields @ column_weights).reshape(*values.shape[:2], -1))
    lat, lon = high_resolution_grid(n_lat)
    region_lat, region_lon = np.meshgrid(lat[rows], lon[columns], indexing="ij")
    folder = Path(folder)
    common = {"seed": seed, "n_lat": n_lat}
    region_path = _write(
        folder / f"{REGION_NAME}.zarr",
        np.concatenate(region),
        (region_lat.ravel(), region_lon.ravel()),
        field_shape=[len(rows), len(columns)],
        what=_describe_region(**common),
        **common,
    )
    global_path = _write(
        folder / f"{GLOBAL_NAME}.zarr",
        np.concatenate(coarse),
        builtin.grid(),
        field_shape=[builtin.N_LAT, builtin.N_LON],
        what=_describe_global(**common),
        **common,
    )
    return region_path, global_path


def _describe_region(*, seed: int, n_lat: int) -> str:
    (south, north), (west, east) = REGION_BOX
    return (
        f"{REGION_NAME} of {PAIR_NAME} (seed {seed}): the points of a {n_lat}x{2 * n_lat} cell-centred lat/lon run of "
        f"the built-in two-layer quasi-geostrophic atmosphere inside {south:g}..{north:g} N, {west:g}..{east:g} E "
        "(longitudes stored in [0, 360)), at full resolution, rows north to south, each row west to east; "
        f"{GLOBAL_NAME} is the same run on the built-in 32x64 grid. Generated by anemo_like.data.regional_pair."
    )


def _describe_global(*, seed: int, n_lat: int) -> str:
    return (
        f"{GLOBAL_NAME} of {PAIR_NAME} (seed {seed}): a {n_lat}x{2 * n_lat} cell-centred lat/lon run of the built-in "
        "two-layer quasi-geostrophic atmosphere coarsened to the built-in 32x64 grid by the area mean over each "
        f"coarse cell; {REGION_NAME} holds the same run's regional points at full resolution. Generated by "
        "anemo_like.data.regional_pair."
    )


def _write(
    path: Path,
    prognostic: np.ndarray,
    points: tuple[np.ndarray, np.ndarray],
    *,
    field_shape: list[int],
    what: str,
    seed: int,
    n_lat: int,
) -> Path:
    """One store of the pair: prognostic fields (dates, len(PROGNOSTIC), grid) at points (latitudes, longitudes)."""
    latitudes, longitudes = points
    attrs = {
        "description": what + " Dates are labels only (no seasonal or diurnal cycle); fields have 14 mantissa bits.",
        "builtin": {"name": PAIR_NAME, "seed": seed, "n_lat": n_lat},
        "constant_fields": list(builtin.FORCINGS),
        "field_shape": field_shape,
        "variables_metadata": builtin.variables_metadata(),
    }
    dates = builtin.START_DATE + np.arange(len(prognostic)) * np.timedelta64(builtin.FREQUENCY_HOURS, "h")
    return write_anemoi_zarr(
        path,
        data=builtin.stored_values(prognostic.astype(np.float32), latitudes=latitudes, longitudes=longitudes),
        variables=builtin.VARIABLES,
        dates=dates,
        latitudes=latitudes,
        longitudes=longitudes,
        frequency=f"{builtin.FREQUENCY_HOURS}h",
        attrs=attrs,
    )


def ensure_regional_pair(cache_dir: str | Path, *, seed: int, progress: bool = True) -> tuple[Path, Path]:
    """Paths of ``cache_dir/<PAIR_NAME>-seed<seed>-{region,global}.zarr``, generating both first if either is missing
    (``progress``: showing the simulated dates).

    Both are written into a temporary folder and renamed into place; another process finishing first is fine. A lone
    store (its twin lost) is replaced: the pair must come from one run. The run is a child process with one BLAS
    thread (:func:`_generate`): the atmosphere is chaotic, so the rounding of another thread count would grow into
    other weather within weeks, and a seed would not give the same pair on every machine.
    """
    cache = Path(cache_dir).expanduser().resolve()
    paths = tuple(cache / f"{PAIR_NAME}-seed{seed}-{part}.zarr" for part in ("region", "global"))
    if all(path.exists() for path in paths):
        LOG.debug("using the regional pair at %s", cache)
        return paths
    for path in paths:
        builtin.discard_store(path)
    cache.mkdir(parents=True, exist_ok=True)
    scratch = cache / f".{PAIR_NAME}-seed{seed}-{uuid.uuid4().hex[:8]}"
    LOG.info(
        "generating the regional pair %s (seed %d) into %s: a few minutes, once; progress follows",
        PAIR_NAME,
        seed,
        cache,
    )
    start = time.perf_counter()
    try:
        written = _generate(scratch, seed=seed, progress=progress)
        for source, target in zip(written, paths, strict=True):
            if not _move_into_place(source, target):
                break  # another process put its region there first: its global follows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    LOG.info("generated the regional pair %s in %.1f s at %s", PAIR_NAME, time.perf_counter() - start, cache)
    return paths


def _generate(folder: Path, *, seed: int, progress: bool) -> tuple[Path, Path]:
    """:func:`write_regional_pair` of the default size in a child process whose BLAS runs one thread."""
    one_thread = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
    size = [str(N_DATES), str(N_LAT), str(SPIN_UP_DAYS)]
    command = [sys.executable, "-m", "anemo_like.data.regional_pair", str(folder), str(seed), *size, str(int(progress))]
    done = subprocess.run(command, env=os.environ | one_thread, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"generating the regional pair in {folder} failed (exit {done.returncode}; see above)")
    return tuple(Path(line) for line in done.stdout.split())


def _move_into_place(source: Path, target: Path) -> bool:
    """Rename a finished store to ``target``; False if one is already there (another process has just finished the
    same pair: its store is kept)."""
    try:
        os.rename(source, target)
    except OSError:
        if not target.exists():
            raise
        return False
    return True


if __name__ == "__main__":  # the child process of _generate: FOLDER SEED N_DATES N_LAT SPIN_UP_DAYS PROGRESS
    folder_arg, seed_arg, dates_arg, lat_arg, spin_up_arg, progress_arg = sys.argv[1:]
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    for written_path in write_regional_pair(
        folder_arg, seed=int(seed_arg), n_dates=int(dates_arg), n_lat=int(lat_arg), spin_up_days=float(spin_up_arg),
        progress=bool(int(progress_arg)),
    ):  # fmt: skip
        print(written_path)

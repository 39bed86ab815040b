#!/usr/bin/env python3
"""Write an anemoi-datasets zarr of smooth random fields on an octahedral reduced Gaussian grid (``O<N>``: O96 has
40,320 points, O320 421,120) or a regular NLATxNLON grid, with the built-in dataset's variables.

For profiling and benchmarking at sizes the built-in 32x64 dataset does not have, with the quickstart config
unchanged but for ``data.dataset``. The dates straddle the quickstart's train/validation split (2000-11-01).

    python benchmarks/data/synthetic_dataset.py --grid 96x192 --out /tmp/ref-96x192.zarr
    python benchmarks/data/synthetic_dataset.py --grid O96 --dates 60 --out /tmp/o96.zarr
    anemo-profile --doctor data.dataset=/tmp/ref-96x192.zarr graph.mesh_resolution=4 model.num_channels=256 ...
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from anemo_like.data.builtin import FORCINGS, PROGNOSTIC
from anemo_like.data.grids import grid_from_name
from anemo_like.data.zarr_writer import write_anemoi_zarr


def smooth_fields(lat: np.ndarray, lon: np.ndarray, times: np.ndarray, count: int, seed: int) -> np.ndarray:
    """(times, count, points): travelling low-wavenumber waves plus a little noise, unit scale."""
    rng = np.random.default_rng(seed)
    out = np.empty((len(times), count, lat.size), dtype=np.float32)
    for v in range(count):
        field = np.zeros((len(times), lat.size))
        for _ in range(6):
            k, m = rng.integers(1, 6), rng.integers(1, 4)
            phase, speed = rng.uniform(0, 2 * np.pi), rng.uniform(-0.3, 0.3)
            field += np.cos(m * lat)[None] * np.sin(k * lon[None] + phase + speed * times[:, None])
        out[:, v] = field + 0.05 * rng.standard_normal(field.shape)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="96x192", help="O<N> (octahedral reduced Gaussian) or NLATxNLON grid")
    parser.add_argument("--dates", type=int, default=48, help="6-hourly dates from 2000-10-25")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="zarr path to create (must not exist)")
    args = parser.parse_args()
    try:
        grid = grid_from_name(args.grid)
    except ValueError as error:
        parser.error(f"argument --grid: {error}")
    if args.dates < 1:
        parser.error(f"argument --dates: at least 1 date is needed, got {args.dates}")
    out = Path(args.out).expanduser().absolute()
    if out.exists():
        parser.error(f"argument --out: {args.out} already exists; remove it first or choose another path")
    above = next(folder for folder in out.parents if folder.exists())  # what the missing folders are made in
    if not above.is_dir() or not os.access(above, os.W_OK):
        why = "is a file, not a folder" if not above.is_dir() else "is not writable"
        parser.error(f"argument --out: {args.out} cannot be created: {above} {why}; choose a path you can write")
    lat_deg, lon_deg = grid.latitudes, grid.longitudes
    lat, lon = np.deg2rad(lat_deg), np.deg2rad(lon_deg)
    dates = np.datetime64("2000-10-25T00:00:00", "s") + np.arange(args.dates) * np.timedelta64(6, "h")
    forcing = {
        "cos_latitude": np.cos(lat),
        "sin_latitude": np.sin(lat),
        "cos_longitude": np.cos(lon),
        "sin_longitude": np.sin(lon),
    }
    data = np.empty((args.dates, len(FORCINGS) + len(PROGNOSTIC), 1, lat.size), dtype=np.float32)
    for i, name in enumerate(FORCINGS):
        data[:, i, 0] = forcing[name]
    data[:, len(FORCINGS) :, 0] = smooth_fields(lat, lon, np.arange(args.dates) * 0.25, len(PROGNOSTIC), args.seed)
    path = write_anemoi_zarr(
        args.out,
        data=data,
        variables=[*FORCINGS, *PROGNOSTIC],
        dates=dates,
        latitudes=lat_deg,
        longitudes=lon_deg,
        frequency="6h",
    )
    print(json.dumps({"path": str(path), "grid": args.grid, "points": int(lat.size), "dates": args.dates}))


if __name__ == "__main__":
    main()

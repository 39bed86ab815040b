#!/usr/bin/env python3
"""Writing a forecast as GRIB2 against netCDF, side by side, through the package's own write functions
(``write_grib``, ``write_forecast``): a 10-day O96 forecast by default (40 steps of 6 h, 40,320 points, the built-in
dataset's 7 output variables, smooth random float32 fields, one initial date). Prints ONE JSON line: the median
seconds of each over ``--repeats`` alternating writes, their ratio, the file sizes.

    python benchmarks/speed/grib_write.py                      # O96, 40 steps
    python benchmarks/speed/grib_write.py --grid O48 --steps 4 --repeats 1
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from anemo_like.config.inference import GribConfig, MarsKeys
from anemo_like.data.builtin import PROGNOSTIC
from anemo_like.data.grids import grid_from_name
from anemo_like.inference.grib_output import grib_plan, write_grib
from anemo_like.inference.output import forecast_dataset, write_forecast

KEYS = {  # the built-in dataset's variables in GRIB, as in inference/config/quickstart.yaml
    "sp": MarsKeys(param="sp"),
    **{
        name: MarsKeys(param=name.split("_")[0], levtype="pl", levelist=int(name.split("_")[1]))
        for name in ("t_850", "u_250", "u_850", "v_250", "v_850", "z_500")
    },
}


def forecast(grid_name: str, steps: int, seed: int = 0):
    """The xr.Dataset anemo-infer writes for one initial date: smooth random fields (1, 1, L, G, V) float32."""
    grid = grid_from_name(grid_name)
    lat, lon = np.radians(grid.latitudes), np.radians(grid.longitudes)
    rng = np.random.default_rng(seed)
    fields = np.empty((1, 1, steps, grid.size, len(PROGNOSTIC)), dtype=np.float32)
    for v in range(len(PROGNOSTIC)):
        k, m = rng.integers(1, 6, size=2)
        phase = rng.uniform(0, 2 * np.pi, size=steps)[:, None]
        fields[0, 0, :, :, v] = 280 + 20 * np.cos(m * lat) * np.sin(k * lon + phase)
    store = SimpleNamespace(latitudes=grid.latitudes, longitudes=grid.longitudes, attrs={}, path="synthetic")
    inputs = SimpleNamespace(
        store=store,
        roles=SimpleNamespace(output=list(PROGNOSTIC), prognostic=list(PROGNOSTIC)),
        init_dates=np.array(["2000-11-01T00"], dtype="datetime64[s]"),
        steps=steps,
        step=datetime.timedelta(hours=6),
    )
    return forecast_dataset(fields, inputs, checkpoint=Path("synthetic.pt"), precision="fp32"), grid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="O96", help="O<N> or NLATxNLON")
    parser.add_argument("--steps", type=int, default=40, help="lead steps of 6 h")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bits", type=int, default=16, help="grib.bits_per_value")
    args = parser.parse_args()
    dataset, grid = forecast(args.grid, args.steps)
    seconds: dict[str, list[float]] = {"grib": [], "netcdf": []}
    with tempfile.TemporaryDirectory() as folder:
        grib, netcdf = Path(folder) / "forecast.grib", Path(folder) / "forecast.nc"
        plan = grib_plan(grib, keys=KEYS, latitudes=grid.latitudes, longitudes=grid.longitudes,
                         grib=GribConfig(bits_per_value=args.bits), members=1, ensemble_stats=False)  # fmt: skip
        for _ in range(args.repeats):
            for kind, write in (
                ("grib", lambda: write_grib(dataset, plan)),
                ("netcdf", lambda: write_forecast(dataset, netcdf)),
            ):
                start = time.perf_counter()
                write()
                seconds[kind].append(time.perf_counter() - start)
        sizes = {kind: path.stat().st_size for kind, path in (("grib", grib), ("netcdf", netcdf))}
    median = {kind: float(np.median(values)) for kind, values in seconds.items()}
    print(
        json.dumps(
            {
                "grid": args.grid,
                "points": grid.size,
                "steps": args.steps,
                "variables": len(KEYS),
                "messages": args.steps * len(KEYS),
                "bits_per_value": args.bits,
                "repeats": args.repeats,
                "grib_s": round(median["grib"], 4),
                "netcdf_s": round(median["netcdf"], 4),
                "grib_over_netcdf": round(median["grib"] / median["netcdf"], 3),
                "grib_mib": round(sizes["grib"] / 2**20, 2),
                "netcdf_mib": round(sizes["netcdf"] / 2**20, 2),
                "plan_kind": plan.kind.name,
            }
        )
    )


if __name__ == "__main__":
    main()

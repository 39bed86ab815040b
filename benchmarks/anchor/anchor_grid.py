#!/usr/bin/env python3
"""Run the anchor harness (``../shared/bench/anchor/run.py``, anemoi-models) on data points read from a file.

The harness builds regular lat/lon grids and Fibonacci point sets only; this runs it, in the anchor's Python,
with its data coordinates taken from an ``.npz`` holding ``latitudes`` and ``longitudes`` in degrees (e.g. an
octahedral O<N> grid written by ``benchmarks/scaling/scaling.py``), so both systems train on the same points.
Every other argument goes to the harness unchanged; ``--grid`` is recorded as given.

    /tmp/anchor/venv/bin/python benchmarks/anchor/anchor_grid.py --points /tmp/O96.npz --grid O96 --mesh-res 5 ...
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.script_runs import ANCHOR_RUN


def harness() -> ModuleType:
    """The anchor harness module (``run.py``): its graph recipe, variable names and ``main``."""
    spec = importlib.util.spec_from_file_location("anchor_run", ANCHOR_RUN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    if "--points" not in argv:
        raise SystemExit("anchor_grid.py: --points FILE.npz (latitudes, longitudes in degrees) is required")
    at = argv.index("--points")
    points, rest = Path(argv[at + 1]), argv[:at] + argv[at + 2 :]
    import numpy as np

    with np.load(points) as arrays:
        latitudes, longitudes = arrays["latitudes"], arrays["longitudes"]
    run = harness()
    run.parse_grid = lambda name: (f"points from {points.name}", latitudes.size, 0)
    run.data_coordinates = lambda kind, n1, n2: (latitudes, longitudes)
    run.main(rest)


if __name__ == "__main__":
    main(sys.argv[1:])

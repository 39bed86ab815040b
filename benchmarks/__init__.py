"""Benchmark scripts, one folder a purpose; each script prints one JSON line (docs/performance.md).

- ``speed/``: step time, memory and host work of one training step; attention backends; data loading; tracking
  and GRIB writing costs.
- ``scaling/``: cost against grid size, sharding over ranks, every command on an operational grid.
- ``anchor/``: side by side with ECMWF's anemoi-models (``../shared/bench/anchor``), imported checkpoints.
- ``skill/``: training runs scored against anemoi-training's and the built-in baselines.
- ``gpu/``: the GPU proof kit (``make gpu-check``), profiles and the anchor on a GPU.
- ``data/``: synthetic anemoi-datasets zarr archives.
- ``script_runs.py``: what the scripts share (paths, running a command and reading its JSON line)."""

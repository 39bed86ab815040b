"""Synthetic anemoi-datasets zarr archives on any grid, for benchmarks and tests."""

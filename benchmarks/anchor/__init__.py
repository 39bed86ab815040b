"""Side by side with ECMWF's anemoi-models (../shared/bench/anchor): step cost, grids, imported checkpoints."""

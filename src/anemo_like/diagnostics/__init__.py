"""Diagnostics shared by training, inference and profiling: plots, phase clock, memory sampler and snapshots,
live-tensor tracking."""

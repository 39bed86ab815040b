"""Kernels and low-level operations of the network: graph attention (torch, Triton), window attention, edge
chunking, activation checkpointing, scratch buffers, autocast helpers and the model-parallel collectives."""

"""Helpers for tests that spawn a gloo world: a free port, process-group setup and failure-collecting checks."""

from __future__ import annotations

import datetime
import socket

import torch
import torch.distributed as dist
from torch import Tensor


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(rank: int, world: int, port: int) -> None:
    """Join a gloo world of ``world`` processes on localhost (one torch thread per process)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )


class Checks:
    """Comparisons of one rank; failures are collected so every rank keeps running the same collectives."""

    def __init__(self, rank: int, *, rtol: float = 1e-6, atol: float = 1e-6) -> None:
        self.rank, self.failures = rank, []
        self.rtol, self.atol = rtol, atol

    def close(self, name: str, actual: Tensor, expected: Tensor, *, atol: float | None = None) -> None:
        try:
            torch.testing.assert_close(actual, expected, rtol=self.rtol, atol=self.atol if atol is None else atol)
        except AssertionError as error:
            self.failures.append(f"rank {self.rank} {name}: {error}")

    def true(self, name: str, condition: bool) -> None:
        if not condition:
            self.failures.append(f"rank {self.rank} {name}")

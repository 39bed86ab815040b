"""Every rank stops at the same step, without a host-device sync per step.

Each step every rank posts its stop flags (a signal arrived, the time budget is spent) to a non-blocking
all-reduce over a gloo group of CPU tensors, and reads the previous step's result, which has arrived during
this step's compute. A stop therefore takes effect one step after it was first seen, on every rank at once. A
single process reads its own flags at once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from anemo_like.distributed.data_parallel import world_size


class StopVote:
    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo") if world_size() > 1 else None
        self.pending: tuple[dist.Work, torch.Tensor] | None = None

    def __call__(self, flags: tuple[bool, ...]) -> tuple[bool, ...]:
        """Post this step's flags; returns, per flag, whether any rank had set it (the previous step's vote with
        several ranks, all False on the first step)."""
        if self.group is None:
            return flags
        decided = self.finish() or (False,) * len(flags)
        values = torch.tensor([int(f) for f in flags], dtype=torch.int32)
        self.pending = (dist.all_reduce(values, op=dist.ReduceOp.MAX, group=self.group, async_op=True), values)
        return decided

    def finish(self) -> tuple[bool, ...] | None:
        """Wait for the posted vote (every rank must call this at the same step); None when none is posted."""
        if self.pending is None:
            return None
        work, values = self.pending
        work.wait()
        self.pending = None
        return tuple(bool(v) for v in values.tolist())

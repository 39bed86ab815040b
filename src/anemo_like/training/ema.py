"""Weight averaging (``training.ema.decay``): an exponential moving average of the trained weights.

After every optimiser step ``average = decay * average + (1 - decay) * weight`` for each trainable parameter,
on the parameter's device (a sharded model averages its own shards). Validation, the plots and ``inference.pt``
use the average; training checkpoints hold it, so a resumed run continues it exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn


class WeightAverage:
    """The average of ``model``'s trainable parameters, starting from their current values."""

    def __init__(self, model: nn.Module, *, decay: float) -> None:
        self.decay = decay
        self.names = [name for name, p in model.named_parameters() if p.requires_grad]
        self.weights = [p.detach() for p in model.parameters() if p.requires_grad]  # views: see every update
        self.average = [w.clone() for w in self.weights]

    @torch.no_grad()
    def reset(self) -> None:
        """Start the average again from the current weights."""
        torch._foreach_copy_(self.average, self.weights)

    @torch.no_grad()
    def update(self) -> None:
        """Move the average towards the current weights by ``1 - decay`` (no host-device sync)."""
        torch._foreach_lerp_(self.average, self.weights, 1.0 - self.decay)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The model holds the averaged weights inside the block and its trained ones again after it (copied in
        place: the parameters keep their storage)."""
        trained = [w.clone() for w in self.weights]
        torch._foreach_copy_(self.weights, self.average)
        try:
            yield
        finally:
            torch._foreach_copy_(self.weights, trained)

    def state_dict(self) -> dict[str, Tensor]:
        return dict(zip(self.names, self.average, strict=True))

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Restore a saved average; its names must be this model's trainable parameters."""
        if sorted(state) != sorted(self.names):
            raise ValueError(
                "the checkpoint's weight average covers other parameters than this run trains "
                f"({len(state)} saved, {len(self.names)} trained): was training.freeze changed?"
            )
        with torch.no_grad():
            for name, average in zip(self.names, self.average, strict=True):
                average.copy_(state[name])


@contextmanager
def averaged_weights(average: WeightAverage | None) -> Iterator[None]:
    """:meth:`WeightAverage.swapped_in`, or nothing when no average is kept."""
    if average is None:
        yield
    else:
        with average.swapped_in():
            yield

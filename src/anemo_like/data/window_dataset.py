"""Training samples: windows of consecutive normalised states read from an anemoi-datasets zarr."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from anemo_like.data.forcings import computed_forcings
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.zarr_store import AnemoiZarr


class WindowDataset(Dataset):
    """Item i = states at dates first + (i + s * stride) for s in 0..num_states-1, as (num_states, G, V) float32.

    Variables follow ``read_names`` (normalised with ``normalizer``) then ``computed_names`` (not normalised).
    Only the needed dates are read; each worker process opens its own zarr handle.
    """

    def __init__(
        self,
        *,
        store: AnemoiZarr,
        date_start: int,
        date_stop: int,
        stride: int,
        num_states: int,
        read_names: list[str],
        computed_names: list[str],
        normalizer: Normalizer,
    ) -> None:
        self.store = store
        self.date_start = date_start
        self.stride = stride
        self.num_states = num_states
        self.read_index = store.variable_indices(read_names)
        self.computed_names = computed_names
        self.normalizer = normalizer
        span = (num_states - 1) * stride
        self.length = max(0, date_stop - date_start - span)

    def __len__(self) -> int:
        return self.length

    def _date_slice(self, item: int) -> slice:
        first = self.date_start + item
        return slice(first, first + (self.num_states - 1) * self.stride + 1, self.stride)

    def dates(self, item: int) -> np.ndarray:
        """Valid dates (num_states,) datetime64[s] of ``item``."""
        return self.store.dates[self._date_slice(item)]

    def __getitem__(self, item: int) -> torch.Tensor:
        if not 0 <= item < self.length:
            raise IndexError(f"sample {item} out of range 0..{self.length - 1}")
        values = self.normalizer.normalize(
            self.store.read(self._date_slice(item), self.read_index), axis=1
        )  # (T, V, G)
        if self.computed_names:
            forcing = computed_forcings(self.computed_names, self.dates(item), self.store.longitudes)
            values = np.concatenate([values, forcing], axis=1)
        return torch.from_numpy(np.ascontiguousarray(values.transpose(0, 2, 1)))

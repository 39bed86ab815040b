"""Training samples: windows of consecutive normalised states read from an anemoi-datasets zarr."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from anemo_like.config.schema import NanPolicy
from anemo_like.data.forcings import computed_forcings
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.zarr_errors import DatasetError
from anemo_like.data.zarr_store import AnemoiZarr


class NonFiniteDataError(DatasetError):
    """A sample holds NaN or inf values and ``data.nan_policy`` is ``error``."""


class WindowDataset(Dataset):
    """Item i = states at dates first + (i + s * stride) for s in 0..num_states-1, as (num_states, G, V) float32.

    Variables follow ``read_names`` (normalised with ``normalizer``, or left in physical units with
    ``normalize=False`` for the training device to normalise) then ``computed_names`` (never normalised).
    Only the needed dates (and, for :meth:`with_grid`, grid points) are read; each worker process opens its own
    zarr handle.

    Non-finite values raise :class:`NonFiniteDataError` (``nan_policy="error"``), or (``"mask"``) become 0 in the
    first ``input_states`` states and in variables not in ``target_names`` (unnormalised: the variable's offset,
    which normalises to 0), and NaN in the targets (states from ``input_states`` on, variables in
    ``target_names``), for the loss to leave out.

    With ``initial_members`` E > 1 (an ensemble dataset feeding ensemble training) the states above are those of
    the dataset's member 0, followed by the ``input_states`` initial states of members 1 .. E - 1: items are
    (num_states + (E - 1) * input_states, G, V).
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
        nan_policy: NanPolicy = "error",
        input_states: int = 0,
        target_names: Sequence[str] = (),
        normalize: bool = True,
        initial_members: int = 1,
    ) -> None:
        self.store = store
        self.date_start = date_start
        self.date_stop = date_stop  # dates [date_start, date_stop) of the split
        self.stride = stride
        self.num_states = num_states
        self.read_index = store.variable_indices(read_names)
        self.computed_names = computed_names
        self.normalizer = normalizer
        self.normalize = normalize
        self.nan_policy = nan_policy
        self.read_names = list(read_names)
        self.input_states, self.initial_members = input_states, initial_members
        total = num_states + (initial_members - 1) * input_states
        target_state = (np.arange(total) >= input_states) & (np.arange(total) < num_states)
        is_target = np.isin(read_names, list(target_names))[None, :, None]  # (1, V, 1)
        self.keep_nan = is_target & target_state[:, None, None]  # (T, V, 1)
        span = (num_states - 1) * stride
        self.length = max(0, date_stop - date_start - span)
        self.grid = slice(None)

    def with_grid(self, start: int, stop: int) -> WindowDataset:
        """The same samples restricted to grid points [start, stop): items (num_states, stop - start, V)."""
        part = copy.copy(self)
        part.grid = slice(start, stop)
        return part

    def __len__(self) -> int:
        return self.length

    def _date_slice(self, item: int) -> slice:
        first = self.date_start + item
        return slice(first, first + (self.num_states - 1) * self.stride + 1, self.stride)

    def dates(self, item: int) -> np.ndarray:
        """Valid dates (num_states,) datetime64[s] of ``item``."""
        return self.store.dates[self._date_slice(item)]

    def _state_dates(self, item: int) -> np.ndarray:
        """The valid date of every state of ``item``, the other members' initial states included."""
        dates = self.dates(item)
        return np.concatenate([dates, *[dates[: self.input_states]] * (self.initial_members - 1)])

    def _read(self, item: int) -> np.ndarray:
        """(T, V, G) physical values: member 0's states, then the other members' initial states."""
        dates = self._date_slice(item)
        raw = self.store.read(dates, self.read_index, grid=self.grid)
        if self.initial_members == 1:
            return raw
        first = slice(dates.start, dates.start + (self.input_states - 1) * self.stride + 1, self.stride)
        members = range(1, self.initial_members)
        others = [self.store.read(first, self.read_index, self.grid, member) for member in members]
        return np.concatenate([raw, *others])

    def __getitem__(self, item: int) -> torch.Tensor:
        if not 0 <= item < self.length:
            raise IndexError(f"sample {item} out of range 0..{self.length - 1}")
        raw = self._read(item)  # (T, V, G)
        bad = ~np.isfinite(raw)
        values = self.normalizer.normalize(raw, axis=1) if self.normalize else raw.astype(np.float32, copy=False)
        if bad.any():
            if self.nan_policy == "error":
                raise NonFiniteDataError(self._non_finite_message(item, bad))
            zero = 0.0 if self.normalize else np.broadcast_to(self.normalizer.offset[None, :, None], bad.shape)[bad]
            values[bad] = zero
            values[bad & self.keep_nan] = np.nan
        if self.computed_names:
            forcing = computed_forcings(
                self.computed_names,
                self._state_dates(item),
                self.store.latitudes[self.grid],
                self.store.longitudes[self.grid],
            )
            values = np.concatenate([values, forcing], axis=1)
        return torch.from_numpy(np.ascontiguousarray(values.transpose(0, 2, 1)))

    def _non_finite_message(self, item: int, bad: np.ndarray) -> str:
        """Name the dataset, each date with non-finite values and the variables affected, and the way out."""
        places = []
        for date, bad_at_date in zip(self._state_dates(item), bad, strict=True):
            counts = zip(self.read_names, bad_at_date.sum(-1), strict=True)
            names = [f"{name} ({count} of {bad.shape[-1]} points)" for name, count in counts if count]
            if names:
                places.append(f"{date} in {', '.join(names)}")
        return (
            f"{self.store.path}: NaN or inf values at {'; '.join(places)}; "
            "fix the dataset, or set data.nan_policy=mask to leave them out of the loss"
        )

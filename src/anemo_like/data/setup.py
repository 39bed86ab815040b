"""From a validated config to datasets, loaders and the variable layout the model needs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Sampler

from anemo_like.config.schema import DataloaderConfig, RunConfig
from anemo_like.data.climatology import mean_state
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.open_dataset import open_dataset
from anemo_like.data.point_masks import BOUNDARY, point_mask
from anemo_like.data.variables import VariableLayout, VariableRoles
from anemo_like.data.window_dataset import WindowDataset
from anemo_like.data.zarr_store import AnemoiZarr, format_frequency, open_anemoi_zarr, parse_frequency

LOG = logging.getLogger(__name__)


class ResumableShuffleSampler(Sampler[int]):
    """Endless stream of sample indices: a fresh seeded permutation per pass, starting at any global position.

    The stream depends only on (seed, position), so a resumed run sees exactly the samples it would have seen.
    With ``world_size`` data-parallel ranks, each global batch of ``batch_size * world_size`` consecutive
    positions is split into contiguous per-rank batches, so together the ranks see what one process with the
    global batch would see. ``pass_length``: samples per pass (the first ones of each permutation); None: all.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        seed: int,
        start: int = 0,
        batch_size: int = 1,
        rank: int = 0,
        world_size: int = 1,
        pass_length: int | None = None,
    ) -> None:
        self.num_samples = num_samples
        self.pass_length = num_samples if pass_length is None else min(pass_length, num_samples)
        self.seed = seed
        self.start = start
        self.batch_size, self.rank, self.world_size = batch_size, rank, world_size

    def _global_stream(self) -> Iterator[int]:
        epoch, offset = divmod(self.start, self.pass_length)
        while True:
            order = torch.randperm(self.num_samples, generator=torch.Generator().manual_seed(self.seed + epoch))
            yield from order[offset : self.pass_length].tolist()
            epoch, offset = epoch + 1, 0

    def __iter__(self) -> Iterator[int]:
        stream = self._global_stream()
        mine = range(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        while True:
            global_batch = [next(stream) for _ in range(self.batch_size * self.world_size)]
            yield from (global_batch[i] for i in mine)


@dataclass(frozen=True)
class LoaderOptions:
    """The ``torch.utils.data.DataLoader`` keyword arguments of one split, from ``dataloader.*`` and the device."""

    batch_size: int
    num_workers: int = 0
    prefetch_factor: int | None = None  # None with 0 workers (the DataLoader refuses a value then)
    pin_memory: bool = False  # only on CUDA: pinning needs an accelerator
    persistent_workers: bool = False

    @classmethod
    def for_split(cls, config: DataloaderConfig, split: Literal["train", "val"], device: torch.device) -> LoaderOptions:
        workers = getattr(config.num_workers, split)
        return cls(
            batch_size=getattr(config.batch_size, split),
            num_workers=workers,
            prefetch_factor=(config.prefetch_factor or 2) if workers else None,
            pin_memory=config.pin_memory and device.type == "cuda",
            persistent_workers=workers > 0 and config.persistent_workers is not False,
        )

    def kwargs(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DataSetup:
    """Everything data-related a run needs."""

    store: AnemoiZarr
    roles: VariableRoles
    normalizer: Normalizer  # for roles.read, in that order
    layout: VariableLayout
    train: WindowDataset
    val: WindowDataset
    stride: int  # dataset dates per model step
    climatology: np.ndarray | None  # (G, V_out) normalised time mean of training dates; None: not computed

    @property
    def input_positions(self) -> list[int]:
        return self.roles.sample_positions(self.roles.input)

    @property
    def output_positions(self) -> list[int]:
        return self.roles.sample_positions(self.roles.output)

    def train_loader(
        self,
        options: LoaderOptions,
        *,
        seed: int,
        start_sample: int,
        rank: int = 0,
        world_size: int = 1,
        grid: tuple[int, int] | None = None,
        limit_batches: int | None = None,
    ) -> DataLoader:
        """Batches of data-parallel instance ``rank`` of ``world_size``; ``start_sample`` is the global position
        (steps done × batch_size × world_size); ``grid``: read only grid points [start, stop); ``limit_batches``:
        global batches per pass over the samples."""
        global_batch = options.batch_size * world_size
        sampler = ResumableShuffleSampler(
            len(self.train),
            seed=seed,
            start=start_sample,
            batch_size=options.batch_size,
            rank=rank,
            world_size=world_size,
            pass_length=None if limit_batches is None else limit_batches * global_batch,
        )
        dataset = self.train if grid is None else self.train.with_grid(*grid)
        return DataLoader(dataset, sampler=sampler, drop_last=True, **options.kwargs())

    def val_loader(self, options: LoaderOptions) -> DataLoader:
        return DataLoader(self.val, shuffle=False, **options.kwargs())

    def device_normalizer(self, device: torch.device) -> DeviceNormalizer | None:
        """Normalises batches on ``device`` when the workers send physical values; None when they normalise."""
        return None if self.train.normalize else DeviceNormalizer(self.normalizer, device)


class DeviceNormalizer:
    """(physical - offset) / scale of the read variables, in place on the training device (fp32)."""

    def __init__(self, normalizer: Normalizer, device: torch.device) -> None:
        self.offset = torch.as_tensor(normalizer.offset, dtype=torch.float32, device=device)
        self.scale = torch.as_tensor(normalizer.scale, dtype=torch.float32, device=device)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """batch: (B, T, G, V_read + V_computed) float32 -> the same tensor, read variables normalised."""
        read = batch[..., : self.offset.shape[0]]
        read.sub_(self.offset).div_(self.scale)
        return batch


def open_val_store(config: RunConfig, train_store: AnemoiZarr) -> AnemoiZarr:
    """``data.val_dataset`` opened and checked against the training dataset's grid and frequency (else the latter)."""
    if config.data.val_dataset is None:
        return train_store
    store = open_anemoi_zarr(Path(config.data.val_dataset).expanduser())
    same_grid = store.latitudes.shape == train_store.latitudes.shape and np.allclose(
        (store.latitudes, store.longitudes), (train_store.latitudes, train_store.longitudes), atol=1e-6
    )
    if not same_grid:
        raise ValueError(
            f"data.val_dataset {store.path}: its grid ({store.latitudes.shape[0]} points) differs from data.dataset "
            f"{train_store.path} ({train_store.latitudes.shape[0]} points), whose grid the model's graph is built on; "
            "validate on a dataset of the same grid"
        )
    if store.frequency != train_store.frequency:
        raise ValueError(
            f"data.val_dataset {store.path}: frequency {format_frequency(store.frequency)} differs from data.dataset "
            f"{train_store.path} ({format_frequency(train_store.frequency)})"
        )
    return store


def _model_step_stride(config: RunConfig, store: AnemoiZarr) -> int:
    """Dataset dates per model step: ``data.timestep`` over the dataset's frequency (a whole multiple of it)."""
    timestep = parse_frequency(config.data.timestep, source="data.timestep")
    frequency = store.frequency
    if timestep % frequency or timestep < frequency:
        raise ValueError(
            f"data.timestep '{config.data.timestep}' must be a multiple of the frequency of {store.path} "
            f"({format_frequency(frequency)})"
        )
    return int(timestep // frequency)


def _read_normalizer(config: RunConfig, store: AnemoiZarr, roles: VariableRoles) -> Normalizer:
    """The normaliser of ``roles.read`` (in that order) from ``data.normalizer`` and the dataset's statistics."""
    read_index = store.variable_indices(roles.read)
    normalizer_config = config.data.normalizer
    unknown = set(normalizer_config.per_variable) - set(roles.read)
    if unknown:
        raise ValueError(f"data.normalizer.per_variable names {sorted(unknown)}, which are not selected variables")
    methods = [normalizer_config.per_variable.get(name, normalizer_config.default) for name in roles.read]
    statistics = {k: np.asarray(v)[read_index] for k, v in store.statistics.items()}
    return Normalizer.from_statistics(names=roles.read, statistics=statistics, methods=methods, source=str(store.path))


def _with_statistics_of(normalizer: Normalizer, source: Normalizer, *, where: str) -> Normalizer:
    """``normalizer`` with the offset and scale of every variable ``source`` also normalises (``where`` names it)."""
    offset, scale = normalizer.offset.copy(), normalizer.scale.copy()
    shared = [name for name in normalizer.names if name in source.names]
    for name in shared:
        i, j = normalizer.names.index(name), source.names.index(name)
        offset[i], scale[i] = source.offset[j], source.scale[j]
    others = [name for name in normalizer.names if name not in source.names]
    LOG.info(
        "normalisation statistics of %s for %d variables%s",
        where,
        len(shared),
        f"; of the dataset for {', '.join(others)}" if others else "",
    )
    return Normalizer(list(normalizer.names), offset, scale)


def _variable_layout(
    config: RunConfig, roles: VariableRoles, normalizer: Normalizer, *, limited_area: bool
) -> VariableLayout:
    """The model's input/output variable layout, with the normalised zero of each ``model.relu_bounded`` output;
    a ``limited_area`` model also reads the forced boundary values of the states it predicts."""
    floors = {}
    for name in config.model.relu_bounded:
        i = roles.read.index(name)
        floors[roles.output.index(name)] = float(-normalizer.offset[i] / normalizer.scale[i])
    return VariableLayout(
        num_input=len(roles.input),
        num_output=len(roles.output),
        prognostic_input=list(range(len(roles.prognostic))),
        prognostic_output=list(range(len(roles.prognostic))),
        relu_floor=floors,
        boundary_inputs=limited_area,
    )


def _split_windows(
    config: RunConfig,
    store: AnemoiZarr,
    split: Literal["train", "val"],
    *,
    rollout: int,
    stride: int,
    roles: VariableRoles,
    normalizer: Normalizer,
) -> WindowDataset:
    """The samples of ``data.splits.<split>`` in ``store``: multistep input states, then ``rollout`` targets (and
    an ensemble run's initial states of the store's other members, up to ``training.ensemble.members``)."""
    window, members = getattr(config.data.splits, split), config.training.ensemble.members
    try:
        start, stop = store.date_range(window.start, window.end)
    except ValueError as error:
        raise ValueError(f"data.splits.{split}: {error}") from None
    multistep = config.training.multistep_input
    dataset = WindowDataset(
        store=store,
        date_start=start,
        date_stop=stop,
        stride=stride,
        num_states=multistep + rollout,
        read_names=roles.read,
        computed_names=roles.computed,
        normalizer=normalizer,
        nan_policy=config.data.nan_policy,
        input_states=multistep,
        target_names=roles.output,
        normalize=not config.dataloader.normalize_on_device,
        initial_members=min(members, store.shape[2]) if members > 1 else 1,
    )
    if len(dataset) == 0:
        rollout_key = "training.rollout.max" if split == "train" else "training.val_rollout"
        raise ValueError(
            f"data.splits.{split} ({window.start} .. {window.end}) of {store.path} holds {stop - start} dates, "
            f"too few for {multistep + rollout} states {config.data.timestep} apart "
            f"(training.multistep_input {multistep} + {rollout_key} {rollout}); widen the split or shorten the rollout"
        )
    return dataset


def _check_splits_disjoint(config: RunConfig, train: WindowDataset, val: WindowDataset) -> None:
    """Refuse train and val windows that share dates of one dataset (unless ``data.splits.allow_overlap``); a
    ``data.val_dataset`` of its own is another trajectory, whose dates may be the training ones."""
    same_dataset = train.store is val.store or train.store.path.resolve() == val.store.path.resolve()
    first, stop = max(train.date_start, val.date_start), min(train.date_stop, val.date_stop)
    if config.data.splits.allow_overlap or not same_dataset or first >= stop:
        return
    splits, dates = config.data.splits, train.store.dates
    raise ValueError(
        f"data.splits.train ({splits.train.start} .. {splits.train.end}) and data.splits.val ({splits.val.start} .. "
        f"{splits.val.end}) of {train.store.path} share {stop - first} date(s), {dates[first]} .. {dates[stop - 1]}: "
        "validation would score dates the model trained on; make the windows disjoint or set "
        "data.splits.allow_overlap=true"
    )


def _instances_of_open_group(config: RunConfig) -> int:
    """Data-parallel replicas: the open group's ranks over num_gpus_per_model x num_gpus_per_ensemble (or 1)."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    hardware = config.system.hardware
    return max(1, dist.get_world_size() // (hardware.num_gpus_per_model * hardware.num_gpus_per_ensemble))


def _check_train_batch(config: RunConfig, train: WindowDataset, instances: int) -> None:
    """Refuse a global training batch (``batch_size.train`` x ``instances``) above the split's samples: the endless
    sampler would fill it by repeating samples, so memory grows with the batch size, not with the data."""
    batch, samples = config.dataloader.batch_size.train, len(train)
    if batch * instances <= samples:
        return
    window, most = config.data.splits.train, samples // instances
    each = f" on each of {instances} data-parallel model instances ({batch * instances} a step)"
    fix = f"lower dataloader.batch_size.train to at most {most}" if most else "run fewer data-parallel model instances"
    raise ValueError(
        f"dataloader.batch_size.train={batch}{each if instances > 1 else ''} is more than the {samples} samples of "
        f"data.splits.train ({window.start} .. {window.end}) of {train.store.path}: a batch would repeat samples; "
        f"{fix} or widen the split"
    )


def _climatology_baseline(
    config: RunConfig, store: AnemoiZarr, roles: VariableRoles, normalizer: Normalizer
) -> np.ndarray | None:
    """(G, V_out) normalised mean of ``training.val_climatology_dates`` training dates; None when that is 0."""
    if not config.training.val_climatology_dates:
        return None
    started = time.perf_counter()
    window = config.data.splits.train  # checked by _split_windows
    train_start, train_stop = store.date_range(window.start, window.end)
    num_dates = min(config.training.val_climatology_dates, train_stop - train_start)
    read_index = store.variable_indices(roles.read)
    mean = mean_state(store, date_start=train_start, date_stop=train_stop, variables=read_index, max_dates=num_dates)
    climatology = normalizer.normalize(mean, axis=-1)[:, [roles.read.index(n) for n in roles.output]]
    LOG.info("climatology baseline: mean of %d training dates, %.1f s", num_dates, time.perf_counter() - started)
    return climatology


def setup_data(
    config: RunConfig,
    *,
    data_parallel_size: int | None = None,
    statistics: tuple[str, Normalizer] | None = None,
    layout: VariableLayout | None = None,
) -> DataSetup:
    """Open the dataset(s) (:func:`~anemo_like.data.open_dataset.open_dataset`: a cut-out or limited-area view
    with ``data.cutout`` / ``data.boundary``), check the config against them and build the train/val windows.
    ``data_parallel_size``: the model instances sharing each global training batch (None: from the open process
    group, else 1); ``statistics``: (where from, normaliser) whose offsets and scales replace the dataset's for the
    variables it has; ``layout``: the model's variable layout as a checkpoint stores it (None: from the config)."""
    store = open_dataset(config)
    val_store = open_val_store(config, store)
    roles = VariableRoles.from_config(config.data.variables)
    stride = _model_step_stride(config, store)
    normalizer = _read_normalizer(config, store, roles)
    if statistics is not None:
        normalizer = _with_statistics_of(normalizer, statistics[1], where=statistics[0])
    if layout is None:
        layout = _variable_layout(config, roles, normalizer, limited_area=point_mask(store, BOUNDARY) is not None)
    shared = {"stride": stride, "roles": roles, "normalizer": normalizer}
    train = _split_windows(config, store, "train", rollout=config.training.rollout.max, **shared)
    val = _split_windows(config, val_store, "val", rollout=config.training.val_rollout, **shared)
    _check_splits_disjoint(config, train, val)
    _check_train_batch(config, train, data_parallel_size or _instances_of_open_group(config))
    LOG.info(
        "data %s: %d grid points, train %d samples, val %d samples%s, inputs %s, outputs %s",
        store.path,
        store.latitudes.shape[0],
        len(train),
        len(val),
        "" if val_store is store else f" of {val_store.path}",
        roles.input,
        roles.output,
    )
    climatology = _climatology_baseline(config, store, roles, normalizer)
    return DataSetup(store, roles, normalizer, layout, train, val, stride, climatology)

"""The forecast's inputs: the dataset (or the input files) checked against the checkpoint, the initial dates, the
model input windows."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from anemo_like.checkpoints.inference import InferenceBundle
from anemo_like.config.inference import InferenceConfig
from anemo_like.config.schema import RunConfig
from anemo_like.data.forcings import computed_forcings
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.open_dataset import open_dataset, resolve_name
from anemo_like.data.variables import VariableRoles
from anemo_like.data.zarr_store import AnemoiZarr, format_frequency, open_anemoi_zarr, parse_frequency
from anemo_like.inference.boundary_forcing import BoundaryForcing, boundary_forcing
from anemo_like.inference.mars_keys import metadata_sources
from anemo_like.inference.state_files import GRID_FORCINGS, file_initial_indices, read_state_files
from anemo_like.inference.state_source import StateSource, describe

COORDINATE_TOLERANCE_DEG = 1e-3  # the graph stores float32 radians: ~1e-5 degrees of round-off


def variable_metadata(store: StateSource, name: str) -> dict[str, Any]:
    """The dataset's ``variables_metadata`` entry of ``name`` (units, constant_in_time, ...), {} when absent."""
    return dict(store.attrs.get("variables_metadata", {}).get(name, {}))


def constant_in_time(store: StateSource, name: str) -> bool:
    """Whether the dataset marks ``name`` as a field that never changes (``constant_fields`` or its metadata)."""
    return name in store.attrs.get("constant_fields", []) or bool(
        variable_metadata(store, name).get("constant_in_time")
    )


def subset(normalizer: Normalizer, names: list[str]) -> Normalizer:
    """The normaliser of ``names``, a subset of ``normalizer.names``, in that order."""
    index = [normalizer.names.index(name) for name in names]
    return Normalizer(list(names), normalizer.offset[index], normalizer.scale[index])


def dataset_path(config: InferenceConfig, run: RunConfig) -> Path:
    """``dataset``, or the checkpoint's ``data.dataset`` (a generated one regenerated in its cache if needed)."""
    if config.dataset is not None:
        return Path(config.dataset).expanduser()
    return resolve_name(run.data.dataset, run)


def check_fit(store: StateSource, *, bundle: InferenceBundle, checkpoint: Path, needed: list[str]) -> None:
    """Raise one ValueError naming both files and every difference: variables, grid, frequency."""
    problems = []
    missing = [name for name in needed if name not in store.variables]
    if missing:
        problems.append(f"it lacks the variable(s) {', '.join(missing)}")
    grid = np.rad2deg(bundle.graph["data"].x.double().cpu().numpy())  # (G, 2) latitude, longitude
    if store.latitudes.shape[0] != grid.shape[0]:
        problems.append(f"its grid has {store.latitudes.shape[0]} points, the model's {grid.shape[0]}")
    else:
        dlat = np.abs(store.latitudes - grid[:, 0])
        dlon = np.abs((store.longitudes - grid[:, 1] + 180.0) % 360.0 - 180.0)
        worst = np.maximum(dlat, dlon)
        if worst.max() > COORDINATE_TOLERANCE_DEG:
            point = int(worst.argmax())
            problems.append(
                f"its grid coordinates differ from the model's by up to {worst[point]:.3g} degrees (point {point}: "
                f"{store.latitudes[point]:g}, {store.longitudes[point]:g} against {grid[point, 0]:g}, "
                f"{grid[point, 1]:g})"
            )
    step = parse_frequency(bundle.config.data.timestep)
    if step % store.frequency:
        problems.append(
            f"its frequency {format_frequency(store.frequency)} does not divide the model step {format_frequency(step)}"
        )
    if problems:
        raise ValueError(f"{describe(store)} does not fit checkpoint {checkpoint}: {'; '.join(problems)}")


def _requested_dates(config: InferenceConfig, store: StateSource) -> np.ndarray:
    """The configured initial dates (N,) datetime64[s]."""
    if config.dates is not None:
        return np.array([np.datetime64(date, "s") for date in config.dates])
    window = config.date_range
    every = parse_frequency(window.every)
    if every % store.frequency:
        raise ValueError(
            f"date_range.every '{window.every}' must be a multiple of the frequency of {describe(store)} "
            f"({format_frequency(store.frequency)})"
        )
    start = np.datetime64(window.start, "s")
    end = np.datetime64(window.end or window.start, "s")
    if end < start:
        raise ValueError(f"date_range: end {end} is before start {start}")
    return np.arange(start, end + np.timedelta64(1, "s"), np.timedelta64(int(every.total_seconds()), "s"))


@dataclass(frozen=True, kw_only=True)
class ForecastInputs:
    """Where the forecasts start and how model inputs are assembled from the dataset."""

    store: StateSource  # the dataset, or the states read from the input files
    roles: VariableRoles
    normalizer: Normalizer  # the checkpoint's, for roles.read
    nan_policy: str  # the checkpoint's data.nan_policy: "mask" feeds missing inputs as 0
    multistep: int  # input states per forward pass
    stride: int  # dataset dates per model step
    steps: int  # model steps to the lead time
    step: datetime.timedelta  # the model step
    init_indices: np.ndarray  # (N,) int64 dataset indices of the initial dates (the last input state)
    output_steps: int = 1  # states per forward pass (training.multistep_output); ``steps`` still counts model steps
    boundary: BoundaryForcing | None = None  # a limited-area model's forced boundary values
    imputed: tuple[str, ...] = ()  # inputs whose NaN the model fills (its imputer), so they are read as they are
    restored: tuple[str, ...] = ()  # outputs the model leaves NaN where their input was missing

    @property
    def init_dates(self) -> np.ndarray:
        """(N,) datetime64[s]."""
        return self.store.dates[self.init_indices]

    @property
    def output_normalizer(self) -> Normalizer:
        return subset(self.normalizer, self.roles.output)

    @property
    def window_shape(self) -> tuple[int, int]:
        """(T, V_in) of :meth:`window`: input times plus lead times, model input variables."""
        return self.multistep + self.steps, len(self.roles.input)

    def window(self, init_index: int, grid: slice = slice(None), out: np.ndarray | None = None) -> np.ndarray:
        """Model inputs at the ``multistep`` input times and the ``steps`` lead times, normalised, float32
        (multistep + steps, G, V_in) in the order [prognostic, forcing, computed forcing]; ``grid``: read only this
        block of the grid points (G its length); ``out``: write into this array of that shape instead of a new one.

        Prognostic values after the initial date are NaN (the forecast supplies them); dataset forcings after the
        dataset's last date hold the last value read (only constant ones are used, see :func:`open_inputs`). Read,
        normalised and written one date at a time, so the temporaries are those of one date's fields.
        """
        store, m = self.store, self.multistep
        names = self.roles.prognostic + self.roles.forcing
        offsets = np.arange(1 - m, self.steps + 1)
        valid_times = store.dates[init_index] + offsets * np.timedelta64(int(self.step.total_seconds()), "s")
        rows = self._dataset_rows(init_index, offsets)
        latitudes, longitudes = store.latitudes[grid], store.longitudes[grid]
        if out is None:
            out = np.empty((len(offsets), len(longitudes), self.window_shape[1]), np.float32)
        states = np.stack([self._read_date(int(row), names, grid) for row in rows[:m]])  # (m, V, G)
        self._check_finite(states, valid_times[:m], names, store.dates[init_index])
        values = states[-1]
        for t, row in enumerate(rows):
            if t < m:
                values = states[t]
            elif row != rows[t - 1]:
                values = self._read_date(int(row), names, grid)
            out[t, :, : len(names)] = values.T
            computed = computed_forcings(self.roles.computed, valid_times[t : t + 1], latitudes, longitudes)
            out[t, :, len(names) :] = computed[0].T
        out[m:, :, : len(self.roles.prognostic)] = np.nan
        if self.boundary is not None:
            self._force_boundary(out, store.dates[init_index], valid_times, grid)
        return out

    def _force_boundary(self, out: np.ndarray, init: np.datetime64, valid_times: np.ndarray, grid: slice) -> None:
        """Write the forced prognostic values of the boundary points of ``grid`` into the lead times of ``out``."""
        start, stop, _ = grid.indices(self.boundary.forced.size)
        local = np.flatnonzero(self.boundary.forced[start:stop])
        for t in range(self.multistep, len(valid_times)):
            values = self.boundary.values(init, valid_times[t], grid)  # (V_prognostic, g_forced)
            out[t, local, : len(self.roles.prognostic)] = values.T

    def _dataset_rows(self, init_index: int, offsets: np.ndarray) -> np.ndarray:
        """Dataset index of every valid time ``init + offsets * step`` (T,); beyond the dataset's last date, the last
        date read (every ``stride`` dates from the first)."""
        first = init_index + offsets[0] * self.stride
        last_read = min(init_index + offsets[-1] * self.stride, len(self.store.dates) - 1)
        read = (last_read - first) // self.stride + 1
        return first + np.minimum(np.arange(len(offsets)), read - 1) * self.stride

    def _read_date(self, row: int, names: list[str], grid: slice) -> np.ndarray:
        """The normalised ``names`` at dataset date ``row``, (V, G) float32."""
        raw = self.store.read(slice(row, row + 1), self.store.variable_indices(names), grid=grid)  # (1, V, G)
        return subset(self.normalizer, names).normalize(raw, axis=1)[0]

    def _check_finite(self, values: np.ndarray, dates: np.ndarray, names: list[str], init: np.datetime64) -> None:
        """Non-finite input states (T, V, G): zeroed in place under ``nan_policy: mask``, else an error naming them;
        NaN of the variables the model imputes are left for it."""
        bad = ~np.isfinite(values)
        imputed = [i for i, name in enumerate(names) if name in self.imputed]
        bad[:, imputed] &= ~np.isnan(values[:, imputed])  # NaN there is the model's to fill; inf is not
        if not bad.any():
            return
        if self.nan_policy == "mask":
            values[bad] = 0.0
            return
        places = [
            f"{date} in {', '.join(n for n, b in zip(names, bad_at_date.any(-1), strict=True) if b)}"
            for date, bad_at_date in zip(dates, bad, strict=True)
            if bad_at_date.any()
        ]
        raise ValueError(
            f"{self.store.path}: NaN or inf in the input states of initial date {init} ({'; '.join(places)}); "
            "choose another initial date or fix the dataset"
        )


def _initial_indices(
    config: InferenceConfig, store: AnemoiZarr, *, history: int, multistep: int, step: str
) -> np.ndarray:
    """Dataset indices (N,) of the initial dates; each must be a dataset date with ``history`` dates before it."""
    first, last = store.dates[0], store.dates[-1]
    dates = _requested_dates(config, store)
    outside = dates[(dates < first) | (dates > last)]
    if outside.size:
        raise ValueError(f"initial date {outside[0]} is outside dataset {store.path}, which covers {first} .. {last}")
    indices = np.searchsorted(store.dates, dates)
    off_grid = dates[store.dates[indices] != dates]
    if off_grid.size:
        raise ValueError(
            f"initial date {off_grid[0]} is not a date of dataset {store.path} (every "
            f"{format_frequency(store.frequency)} from {first})"
        )
    short = indices < history
    if short.any():
        date = dates[short][0]
        raise ValueError(
            f"initial date {date} lacks input history: the model starts from {multistep} states {step} apart, but "
            f"dataset {store.path} starts at {first}; use initial dates from {store.dates[history]} on"
        )
    return indices.astype(np.int64)


def _check_forcings_reach(inputs: ForecastInputs, *, lead_time: str) -> None:
    """Forcings that change in time must be in the dataset up to the last input state of the last step."""
    store = inputs.store
    varying = [name for name in inputs.roles.forcing if not constant_in_time(store, name)]
    needed_until = inputs.init_indices + (inputs.steps - 1) * inputs.stride
    beyond = needed_until > len(store.dates) - 1
    if varying and beyond.any():
        n = int(np.flatnonzero(beyond)[0])
        until = inputs.init_dates[n] + (inputs.steps - 1) * np.timedelta64(int(inputs.step.total_seconds()), "s")
        raise ValueError(
            f"initial date {inputs.init_dates[n]} with lead_time {lead_time} needs the forcing(s) "
            f"{', '.join(varying)} until {until}, after the last date {store.dates[-1]} of {describe(store)} "
            "(only forcings constant in time are held beyond it); choose an earlier initial date or a shorter lead_time"
        )


def open_truth(config: InferenceConfig, run: RunConfig) -> AnemoiZarr | None:
    """The dataset: the initial states without ``input``; with it, the truth of ``verify`` and a source of MARS keys,
    opened when ``verify`` is set, ``dataset`` is given, or the checkpoint's dataset file exists (None otherwise).
    Without ``dataset``, a checkpoint trained with ``data.cutout`` or ``data.boundary`` gets that view."""
    if config.input is None or config.verify or config.dataset is not None:
        regional = config.dataset is None and (run.data.cutout is not None or run.data.boundary is not None)
        return open_dataset(run) if regional else open_anemoi_zarr(dataset_path(config, run))
    path = Path(run.data.dataset).expanduser()
    return open_anemoi_zarr(path) if run.data.dataset != "builtin" and path.exists() else None


def _open_files(
    config: InferenceConfig, *, bundle: InferenceBundle, checkpoint: Path, truth: AnemoiZarr | None
) -> StateSource:
    """The states of the input files, checked against the checkpoint's grid; forcings are constant in time where
    the checkpoint's (or the dataset's) variables_metadata says so, and for those of the grid."""
    roles, stored = bundle.roles, bundle.variables_metadata
    metadata = metadata_sources(checkpoint, stored, truth)
    constant = [
        name
        for name in roles.forcing
        if name in GRID_FORCINGS
        or stored.get(name, {}).get("constant_in_time")
        or (truth is not None and constant_in_time(truth, name))
    ]
    known = {} if truth is None else dict(truth.attrs.get("variables_metadata", {}))
    store = read_state_files(
        config,
        names=roles.prognostic + roles.forcing,
        step=parse_frequency(bundle.config.data.timestep),
        metadata=metadata,
        attrs={"constant_fields": constant, "variables_metadata": {**known, **stored}},
    )
    check_fit(store, bundle=bundle, checkpoint=checkpoint, needed=[])
    return store


def _boundary(
    config: InferenceConfig, *, bundle: InferenceBundle, store: StateSource, checkpoint: Path
) -> BoundaryForcing | None:
    """The forced boundary of a limited-area checkpoint's forecasts (None for other models)."""
    run, roles = bundle.config, bundle.roles
    if run.data.boundary is None:
        if config.boundary is not None:
            raise ValueError(
                f"boundary={config.boundary}: checkpoint {checkpoint} is not a limited-area model (its data.boundary "
                "is null), so nothing is forced; leave boundary unset"
            )
        return None
    where = "input=..." if config.input is not None else f"dataset={config.dataset}"
    if config.input is not None or config.dataset is not None:
        raise ValueError(
            f"{where}: checkpoint {checkpoint} is a limited-area model, which starts from its own dataset and its "
            "boundary strip (data.dataset with data.boundary); leave it unset (boundary=FILE gives the boundary)"
        )
    return boundary_forcing(
        config.boundary,
        store=store,
        names=roles.prognostic,
        normalizer=subset(bundle.normalizer, roles.prognostic),
    )


def open_inputs(
    config: InferenceConfig, *, bundle: InferenceBundle, checkpoint: Path, truth: AnemoiZarr | None = None
) -> ForecastInputs:
    """Check the dataset (``truth``; None: :func:`open_truth` opens it) or the input files against the checkpoint and
    resolve the initial dates; ValueError names what differs."""
    run, roles = bundle.config, bundle.roles
    truth = open_truth(config, run) if truth is None else truth
    if config.input is None:
        needed = roles.prognostic + roles.forcing + (roles.diagnostic if config.verify else [])
        check_fit(truth, bundle=bundle, checkpoint=checkpoint, needed=needed)
    elif config.verify:  # the truth of the forecast's variables
        check_fit(truth, bundle=bundle, checkpoint=checkpoint, needed=roles.output)
    store = truth if config.input is None else _open_files(config, bundle=bundle, checkpoint=checkpoint, truth=truth)
    step = parse_frequency(run.data.timestep)
    lead = parse_frequency(config.lead_time, source="lead_time")
    if lead % step:
        raise ValueError(
            f"lead_time '{config.lead_time}' is not a multiple of the model step {run.data.timestep} of checkpoint "
            f"{checkpoint}"
        )
    stride, multistep, steps = int(step // store.frequency), run.training.multistep_input, int(lead // step)
    if config.input is None:
        indices = _initial_indices(
            config, store, history=(multistep - 1) * stride, multistep=multistep, step=run.data.timestep
        )
    else:
        given = config.dates is not None or config.date_range.start is not None
        varying = any(not constant_in_time(store, name) for name in roles.forcing)
        indices = file_initial_indices(
            _requested_dates(config, store) if given else None,
            store,
            step=step,
            multistep=multistep,
            steps=steps,
            varying=varying,
        )
    boundary = _boundary(config, bundle=bundle, store=store, checkpoint=checkpoint)
    inputs = ForecastInputs(
        store=store,
        roles=roles,
        normalizer=bundle.normalizer,
        nan_policy=run.data.nan_policy,
        multistep=multistep,
        stride=stride,
        steps=steps,
        step=step,
        init_indices=indices,
        output_steps=run.training.multistep_output,
        boundary=boundary,
        imputed=tuple(roles.input[i] for i in bundle.model.layout.imputed),
        restored=tuple(roles.output[i] for i in bundle.model.layout.restored),
    )
    _check_forcings_reach(inputs, lead_time=config.lead_time)
    if boundary is not None:
        boundary.check_covers(inputs.init_dates, np.timedelta64(int(step.total_seconds()), "s"), steps)
    return inputs

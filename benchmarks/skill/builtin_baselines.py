"""Baselines of a dataset: 6-h persistence, climatology and a local linear regression, as ONE JSON line.

    PYTHONPATH=src python benchmarks/skill/builtin_baselines.py [DATASET.zarr] [--seed N]

Without a path the built-in dataset is generated into a temporary folder (and timed). RMSEs are area-weighted
(cos latitude), in physical units, over all dates for persistence and climatology. The local regression shows that
the next state is learnable from the last two: per latitude row and variable, a ridge regression of the 6-h change on
the 3 x 3 neighbourhood of every prognostic variable at t and t-6h, fitted on the first 80 % of the dates and scored
on the last 20 % (next to persistence on those same dates).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from anemo_like.data.builtin import write_builtin_dataset
from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr

LEAD_HOURS = 6
TRAIN_FRACTION = 0.8
RIDGE = 1e-3  # relative to the mean diagonal of the normal equations


def prognostic_variables(store: AnemoiZarr) -> list[str]:
    """Every variable not listed as constant in the dataset's attributes."""
    constant = set(store.attrs.get("constant_fields", []))
    return [name for name in store.variables if name not in constant]


def field_shape(store: AnemoiZarr) -> tuple[int, int]:
    """(n_lat, n_lon) of a regular grid stored row by row."""
    if "field_shape" in store.attrs:
        n_lat, n_lon = store.attrs["field_shape"]
        return int(n_lat), int(n_lon)
    n_lat = len(np.unique(store.latitudes))
    return n_lat, store.shape[3] // n_lat


def area_weights(latitudes: np.ndarray) -> np.ndarray:
    """cos(latitude) weights (n_grid,) summing to one."""
    weights = np.cos(np.deg2rad(latitudes))
    return weights / weights.sum()


def rmse(error: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Area-weighted RMSE per variable of errors (dates, variables, grid)."""
    return np.sqrt(np.einsum("tvg,g->v", error.astype(np.float64) ** 2, weights) / error.shape[0])


def neighbourhood(fields: np.ndarray, row: int) -> np.ndarray:
    """3 x 3 neighbours of every point of one latitude row: (..., n_lon, 9 * variables) from (..., V, n_lat, n_lon).

    Rows beyond the first/last latitude repeat the edge row; longitudes wrap around.
    """
    n_lat = fields.shape[-2]
    columns = []
    for di in (-1, 0, 1):
        band = fields[..., min(max(row + di, 0), n_lat - 1), :]  # (..., V, n_lon)
        for dj in (-1, 0, 1):
            columns.append(np.roll(band, -dj, axis=-1))
    stacked = np.stack(columns, axis=-2)  # (..., V, 9, n_lon)
    return stacked.reshape(*stacked.shape[:-3], -1, stacked.shape[-1]).swapaxes(-1, -2)


def local_regression(values: np.ndarray, *, lead: int, split: int) -> np.ndarray:
    """Predicted states (dates - split, V, n_lat, n_lon) for dates split.. from (dates, V, n_lat, n_lon) values."""
    mean = values[:split].mean(axis=(0, 2, 3), keepdims=True)
    scale = values[:split].std(axis=(0, 2, 3), keepdims=True)
    normed = ((values - mean) / scale).astype(np.float32)
    n_dates, n_vars, n_lat, n_lon = values.shape
    target_dates = np.arange(2 * lead, n_dates)
    train = target_dates[target_dates < split]
    test = target_dates[target_dates >= split]
    prediction = np.empty((len(test), n_vars, n_lat, n_lon))
    for row in range(n_lat):
        around = neighbourhood(normed, row)  # (dates, n_lon, 9 V)

        def features(dates: np.ndarray, around: np.ndarray = around) -> np.ndarray:
            bias = np.ones((len(dates), n_lon, 1), np.float32)
            parts = [around[dates - lead], around[dates - 2 * lead], bias]
            return np.concatenate(parts, axis=-1).reshape(len(dates) * n_lon, -1)

        x_train = features(train)
        change = normed[train, :, row] - normed[train - lead, :, row]  # (dates, V, n_lon)
        y_train = change.transpose(0, 2, 1).reshape(-1, n_vars)
        gram = (x_train.T @ x_train).astype(np.float64)
        gram[np.diag_indices_from(gram)] += RIDGE * np.trace(gram) / len(gram)
        coefficients = np.linalg.solve(gram, (x_train.T @ y_train).astype(np.float64)).astype(np.float32)
        predicted_change = (features(test) @ coefficients).reshape(len(test), n_lon, n_vars).transpose(0, 2, 1)
        prediction[:, :, row] = normed[test - lead, :, row] + predicted_change
    return prediction * scale + mean


def baselines(path: Path) -> dict:
    """Persistence, climatology and local-regression RMSEs per prognostic variable of the dataset at ``path``."""
    store = open_anemoi_zarr(path)
    lead_seconds = LEAD_HOURS * 3600
    if lead_seconds % store.frequency.total_seconds():
        raise ValueError(f"{path}: frequency {store.frequency} does not divide the {LEAD_HOURS} h lead time")
    lead = int(lead_seconds // store.frequency.total_seconds())
    names = prognostic_variables(store)
    values = store.read(slice(None), store.variable_indices(names)).astype(np.float64)  # (dates, V, grid)
    weights = area_weights(store.latitudes)
    persistence = rmse(values[lead:] - values[:-lead], weights)
    climatology = rmse(values - values.mean(axis=0), weights)

    n_lat, n_lon = field_shape(store)
    split = int(TRAIN_FRACTION * len(values))
    grid_values = values.reshape(len(values), len(names), n_lat, n_lon)
    predicted = local_regression(grid_values, lead=lead, split=split).reshape(-1, len(names), n_lat * n_lon)
    truth = values[split:]
    regression = rmse(predicted - truth, weights)
    persistence_test = rmse(truth - values[split - lead : len(values) - lead], weights)
    return {
        name: {
            "persistence_6h": float(persistence[i]),
            "climatology": float(climatology[i]),
            "persistence_over_climatology": float(persistence[i] / climatology[i]),
            "local_regression_test": float(regression[i]),
            "persistence_6h_test": float(persistence_test[i]),
            "regression_over_persistence_test": float(regression[i] / persistence_test[i]),
        }
        for i, name in enumerate(names)
    }


def store_megabytes(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", nargs="?", type=Path, help="anemoi-datasets zarr; default: generate the built-in")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated built-in dataset")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generation_seconds = None
        path = args.dataset
        if path is None:
            start = time.perf_counter()
            path = write_builtin_dataset(Path(tmp) / "builtin.zarr", seed=args.seed)
            generation_seconds = time.perf_counter() - start
        result = {
            "dataset": str(path),
            "generation_s": generation_seconds,
            "store_mb": store_megabytes(path),
            "variables": baselines(path),
        }
    print(json.dumps(_rounded(result)))


if __name__ == "__main__":
    main()

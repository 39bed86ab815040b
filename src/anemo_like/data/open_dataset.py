"""From a run's ``data.dataset`` (with ``data.cutout`` or ``data.boundary``) to the store it reads: the generated
datasets made on first use in the cache folder, then the plain store or its cut-out or limited-area view."""

from __future__ import annotations

import os
from pathlib import Path

from anemo_like.config.schema import RunConfig
from anemo_like.data.boundary import open_boundary
from anemo_like.data.builtin import ensure_builtin_dataset
from anemo_like.data.cutout import open_cutout
from anemo_like.data.zarr_store import AnemoiZarr, open_anemoi_zarr

GENERATED_PAIR_PREFIX = "builtin-"  # 'builtin-region', 'builtin-global': the generated regional pair


def writable_cache_dir(config: RunConfig) -> Path:
    """``system.paths.cache``, created if needed; raises ValueError naming it when it cannot be written."""
    cache = Path(config.system.paths.cache).expanduser()
    try:
        cache.mkdir(parents=True, exist_ok=True)
        probe = cache / f".write-test-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as error:
        raise ValueError(
            f"system.paths.cache {cache} (default: $ANEMO_LIKE_CACHE) is not a writable folder "
            f"({error.strerror}); point ANEMO_LIKE_CACHE or system.paths.cache at a folder you can write"
        ) from None
    return cache


def resolve_name(name: str, config: RunConfig) -> Path:
    """The path of a dataset named in ``config``: 'builtin' and the regional pair ('builtin-region',
    'builtin-global') are generated in the cache folder on first use; any other name is a path."""
    if name == "builtin":
        return ensure_builtin_dataset(
            writable_cache_dir(config), seed=config.data.builtin_seed, progress=config.diagnostics.progress_bar
        )
    if name.startswith(GENERATED_PAIR_PREFIX):
        from anemo_like.data import regional_pair  # on use only: generating the pair is a separate job

        paths = regional_pair.ensure_regional_pair(
            writable_cache_dir(config), seed=config.data.builtin_seed, progress=config.diagnostics.progress_bar
        )
        names = (regional_pair.REGION_NAME, regional_pair.GLOBAL_NAME)
        if name in names:
            return paths[names.index(name)]
    return Path(name).expanduser()


def resolve_dataset_path(config: RunConfig) -> Path:
    """``data.dataset``'s path (a generated one made on first use); checks the cache folder can be written first."""
    if config.graph.cache:
        writable_cache_dir(config)
    return resolve_name(config.data.dataset, config)


def open_dataset(config: RunConfig) -> AnemoiZarr:
    """``data.dataset`` opened, as the cut-out grid with ``data.cutout`` or the limited-area grid with forced
    boundary values with ``data.boundary``; a refusal (variables, dates, the region, the width) names the key."""
    store = open_anemoi_zarr(resolve_dataset_path(config))
    cutout, boundary = config.data.cutout, config.data.boundary
    try:
        if cutout is not None:
            regional = open_anemoi_zarr(resolve_name(cutout.dataset, config))
            return open_cutout(
                regional, store, min_distance_km=cutout.min_distance_km, cache=writable_cache_dir(config)
            )
        if boundary is not None:
            source = open_anemoi_zarr(resolve_name(boundary.dataset, config))
            return open_boundary(store, source, width_km=boundary.width_km, width_rows=boundary.width_rows)
    except ValueError as error:
        if type(error) is not ValueError:  # a damaged file or a missing one keeps its own type
            raise
        raise ValueError(f"data.{'cutout' if cutout is not None else 'boundary'}: {error}") from None
    return store

"""``training.init_from`` read for a run, and ``training.init_model: checkpoint``: the run trains the checkpoint's
own model (architecture, graph, variables, normalisation, layout, multistep), as a model imported from anemoi must
be trained, with this run's data, schedule, chunking and backends."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from anemo_like.checkpoints.weights import CheckpointWeights, StoredModel, read_checkpoint_weights
from anemo_like.config.schema import RunConfig
from anemo_like.data.zarr_store import AnemoiZarr

LOG = logging.getLogger(__name__)
ARCHITECTURE = ("num_channels", "num_heads", "mlp_hidden_ratio", "trainable", "latent_skip", "noise", "relu_bounded")
PROCESSOR = ("type", "num_layers", "window_size")
GRID_TOLERANCE_DEG = 1e-3  # a graph stores float32 radians


def read_warm_start(config: RunConfig) -> CheckpointWeights | None:
    """The weights of ``training.init_from`` on the CPU (None when unset), with the model it describes for
    ``training.init_model: checkpoint``; statistics and model need an inference checkpoint, and a model imported
    from anemoi is trained only as it is."""
    training = config.training
    if training.init_from is None:
        return None
    own = training.init_model == "checkpoint"
    weights = read_checkpoint_weights(Path(training.init_from).expanduser(), key="training.init_from", with_model=own)
    wanted = [
        key for key, on in (("init_statistics", training.init_statistics == "checkpoint"), ("init_model", own)) if on
    ]
    if wanted and weights.normalizer is None:
        raise ValueError(
            f"training.{wanted[0]}=checkpoint: {weights.path} is a training checkpoint, which holds no normalisation "
            "statistics nor model description; start from the run's inference.pt or set "
            f"training.{wanted[0]}={'dataset' if wanted[0] == 'init_statistics' else 'config'}"
        )
    if weights.provenance.get("source") == "anemoi" and not own:
        raise ValueError(
            f"training.init_from={weights.path} holds an anemoi model (imported by anemo-import), whose graph, "
            "variables and normalisation are anemoi's: set training.init_model=checkpoint to train it as it is"
        )
    return weights


def adopt_model(config: RunConfig, stored: StoredModel, source: Path) -> RunConfig:
    """``config`` with the checkpoint's architecture, variables, normalisation, time step and multistep; everything
    else (dataset, splits, schedule, chunking, backends, hardware) stays this run's."""
    kept = stored.config
    model = config.model.model_dump()
    model.update({key: getattr(kept.model, key) for key in ARCHITECTURE})
    model["processor"].update({key: getattr(kept.model.processor, key) for key in PROCESSOR})
    data = config.data.model_dump()
    data["variables"] = kept.data.variables.model_dump()
    data["normalizer"] = kept.data.normalizer.model_dump()  # the statistics themselves come from the checkpoint
    data["timestep"] = kept.data.timestep
    training = config.training.model_dump()
    for key in ("multistep_input", "multistep_output"):
        training[key] = getattr(kept.training, key)
    adopted = RunConfig.model_validate({**config.model_dump(), "model": model, "data": data, "training": training})
    LOG.info(
        "training.init_model=checkpoint: the model of %s (%d channels, %d layers, inputs %s, outputs %s, %d input and "
        "%d output steps of %s), its graph and normalisation",
        source,
        kept.model.num_channels,
        kept.model.processor.num_layers,
        stored.roles.input,
        stored.roles.output,
        kept.training.multistep_input,
        kept.training.multistep_output,
        kept.data.timestep,
    )
    return adopted


def check_same_grid(store: AnemoiZarr, stored: StoredModel, source: Path) -> None:
    """The dataset's grid must be the checkpoint model's (its graph's data nodes, in order)."""
    grid = np.rad2deg(stored.graph["data"].x.double().numpy())
    points = store.latitudes.shape[0]
    if points != grid.shape[0]:
        difference = f"{points} points, the model's grid {grid.shape[0]}"
    else:
        dlat = np.abs(store.latitudes - grid[:, 0])
        dlon = np.abs((store.longitudes - grid[:, 1] + 180.0) % 360.0 - 180.0)
        worst = float(np.maximum(dlat, dlon).max(initial=0.0))
        if worst <= GRID_TOLERANCE_DEG:
            return
        difference = f"points up to {worst:.3g} degrees from the model's grid points"
    raise ValueError(
        f"training.init_model=checkpoint: data.dataset {store.path} has {difference} (the model of {source}); "
        "fine-tune it on a dataset of its own grid"
    )

"""Our run config of an imported model: the sizes, variables, steps and data windows anemoi trained it with, our
defaults for everything else (chunking, backends, the training schedule of a fine-tuning run)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anemo_like.anemoi_import.spec import AnemoiSpec
from anemo_like.anemoi_import.variables import VariableMap
from anemo_like.config.schema import RunConfig

NORMALISERS = {"mean-std", "std", "min-max", "max", "none"}


def _dataset_path(config: dict[str, Any], dataset: str) -> str:
    """Where anemoi read the training data (informational: ``anemo-infer dataset=`` names the one to use)."""
    system_input = (config.get("system") or {}).get("input") or {}
    window = ((config.get("dataloader") or {}).get("training") or {}).get("datasets", {}).get(dataset, {})
    source = system_input.get("dataset") or (window.get("dataset_config") or {}).get("dataset")
    return str(source) if isinstance(source, str) and source else "anemoi-dataset"


def _splits(config: dict[str, Any], dataset: str) -> dict[str, dict[str, str | None]]:
    loader = config.get("dataloader") or {}
    splits = {}
    for ours, theirs in (("train", "training"), ("val", "validation")):
        window = ((loader.get(theirs) or {}).get("datasets") or {}).get(dataset) or loader.get(theirs) or {}
        splits[ours] = {key: None if window.get(key) is None else str(window[key]) for key in ("start", "end")}
    return {**splits, "allow_overlap": True}


def _normaliser_methods(spec: AnemoiSpec, variables: VariableMap) -> dict[str, Any]:
    """anemoi's normalisation method per variable read (the offsets and scales themselves travel in the checkpoint)."""
    config = next(c for _, target, c in spec.processors if target.endswith("InputNormalizer"))
    default = config.get("default", "mean-std")
    methods = {name: method for method, names in config.items() if isinstance(names, list) for name in names}
    per_variable = {name: methods.get(name, default) for name in variables.roles.read}
    return {
        "default": default if default in NORMALISERS else "mean-std",
        "per_variable": {n: m for n, m in per_variable.items() if m != default and m in NORMALISERS},
    }


def imported_run_config(
    anemoi_config: dict[str, Any], spec: AnemoiSpec, variables: VariableMap, *, output: Path, imputed: bool
) -> RunConfig:
    """Our validated run config of the model ``spec`` describes; ``output``: the folder the import writes to."""
    roles = variables.roles
    layers = spec.num_layers
    return RunConfig.model_validate(
        {
            "data": {
                "dataset": _dataset_path(anemoi_config, spec.dataset),
                "variables": {
                    "prognostic": roles.prognostic,
                    "forcing": roles.forcing,
                    "diagnostic": roles.diagnostic,
                    "computed_forcing": roles.computed,
                },
                "normalizer": _normaliser_methods(spec, variables),
                "splits": _splits(anemoi_config, spec.dataset),
                "timestep": spec.timestep,
                "nan_policy": "mask" if imputed else "error",
            },
            "model": {
                "num_channels": spec.num_channels,
                "num_heads": spec.num_heads,
                "mlp_hidden_ratio": spec.mlp_hidden_ratio,
                "trainable": {"nodes": spec.trainable_nodes, "edges": spec.trainable_edges},
                "latent_skip": spec.latent_skip,
                "processor": {"num_layers": layers, "num_chunks": min(2, layers)},
            },
            "training": {
                "multistep_input": spec.multistep_input,
                "multistep_output": spec.multistep_output,
                "rollout": {"start": spec.multistep_output, "max": spec.multistep_output},  # a pass's every state
                "val_rollout": spec.multistep_output,
            },
            "system": {"paths": {"output": str(output), "cache": str(Path("~/.cache/anemo_like"))}},
        }
    )

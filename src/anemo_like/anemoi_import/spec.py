"""What an anemoi checkpoint's config says about its model, checked against what ``anemo-import`` can reproduce.

Everything of anemoi-models' default graph transformer maps onto our model (docs/anemoi.md); an option that does not
is refused by name, all of them in one message, before anything is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from anemo_like.anemoi_import.archive import AnemoiArchive, ImportRefused

SUPPORTED_MODELS = "0.19"  # anemoi-models releases whose layout (keys, edge order, migrations) is read here
METADATA_VERSIONS = ("1.0", "2.0")
FORECASTER = "anemoi.training.tasks.Forecaster"
ENC_PROC_DEC = "anemoi.models.models.AnemoiModelEncProcDec"
KERNELS = {"LayerNorm": "torch.nn.LayerNorm", "Linear": "torch.nn.Linear", "Activation": "torch.nn.GELU"}
FLOORS = ("anemoi.models.layers.bounding.ReluBounding", "anemoi.models.layers.bounding.NormalizedReluBounding")
NORMALIZER = "anemoi.models.preprocessing.normalizer.InputNormalizer"
SKIP = "anemoi.models.layers.residual.SkipConnection"
IMPUTERS = (
    "anemoi.models.preprocessing.imputer.InputImputer",
    "anemoi.models.preprocessing.imputer.ConstantImputer",
)


@dataclass(frozen=True)
class AnemoiSpec:
    """The model an anemoi checkpoint holds, in the terms of our config."""

    dataset: str  # the one dataset's name ("data")
    hidden: str  # the hidden node set's name
    num_channels: int
    num_heads: int
    mlp_hidden_ratio: float
    num_layers: int
    trainable_nodes: int
    trainable_edges: int
    latent_skip: bool
    edge_attributes: tuple[str, ...]  # concatenated in this order into each edge's fixed features
    multistep_input: int
    multistep_output: int
    timestep: str  # "6h"
    boundings: tuple[tuple[str, tuple[str, ...]], ...]  # (class, variables) of the output floors, in order
    processors: tuple[tuple[str, str, dict[str, Any]], ...]  # (name, class, config), in anemoi's order
    models_version: str
    training_version: str


def _versions(archive: AnemoiArchive) -> tuple[str, str]:
    metadata, path = archive.metadata, archive.path
    modules = (metadata.get("provenance_training") or {}).get("module_versions") or {}
    models = str((modules.get("anemoi.models") or {}).get("version", "unknown"))
    training = str((modules.get("anemoi.training") or {}).get("version", "unknown"))
    if str(metadata.get("version")) not in METADATA_VERSIONS:
        raise ImportRefused(
            f"{path}: anemoi metadata version {metadata.get('version')!r} is a layout anemo-import does not know "
            f"(it reads {', '.join(METADATA_VERSIONS)})"
        )
    release = tuple(int(part) for part in re.findall(r"\d+", models)[:2]) or (0, 0)
    supported = tuple(int(part) for part in SUPPORTED_MODELS.split("."))
    if release != supported:
        todo = (
            f"migrate it to anemoi-models {SUPPORTED_MODELS} first (anemoi-models' own migration)"
            if release < supported
            else f"a newer layout than anemo-import reads: use a checkpoint of anemoi-models {SUPPORTED_MODELS}"
        )
        raise ImportRefused(
            f"{path} was written by anemoi-models {models} (anemoi-training {training}); anemo-import reads the "
            f"layout of anemoi-models {SUPPORTED_MODELS}.x (anemoi-training 0.17): {todo}"
        )
    return models, training


def _same(values: dict[str, Any], what: str, problems: list[str]) -> Any:
    """The one value all of ``values`` (component -> value) share; a problem when they differ."""
    distinct = {repr(v) for v in values.values()}
    if len(distinct) > 1:
        problems.append(f"{what} differs between {', '.join(f'{k} {v!r}' for k, v in values.items())}")
    return next(iter(values.values()))


def _block_problems(name: str, block: dict[str, Any], target: str) -> list[str]:
    problems = [] if block.get("_target_") == target else [f"{name} is {block.get('_target_')} (only {target})"]
    options = {
        "qk_norm": (block.get("qk_norm", False), False),
        "edge_pre_mlp": (block.get("edge_pre_mlp", False), False),
        "mlp_implementation": (block.get("mlp_implementation", "mlp"), "mlp"),
        "attn_channels": (block.get("attn_channels"), None),
    }
    problems += [
        f"{name}.{key}={json.dumps(value)} (only {json.dumps(want)})"
        for key, (value, want) in options.items()
        if value != want
    ]
    kernels = block.get("layer_kernels") or {}
    for kernel, want in KERNELS.items():
        entry = kernels.get(kernel) or {"_target_": want}
        options = {key: value for key, value in entry.items() if key != "_target_"}
        if entry.get("_target_") != want or options not in ({}, {"approximate": "none"}):  # GELU: erf form only
            problems.append(f"{name}.layer_kernels.{kernel}={json.dumps(entry)} (only {want})")
    return problems


def _model_problems(model: dict[str, Any], dataset: str) -> list[str]:
    problems = []
    target = (model.get("model") or {}).get("_target_")
    if target != ENC_PROC_DEC:
        problems.append(f"model.model._target_={target} (ensemble, diffusion, hierarchical and transport models)")
    encoders, decoders = model.get("encoders") or {}, model.get("decoders") or {}
    if len(encoders) != 1 or len(decoders) != 1:
        problems.append(
            f"model.encoders and model.decoders hold {len(encoders)} and {len(decoders)} entries (only one of each: "
            "multi-dataset models are not read)"
        )
    for name, encoder in encoders.items():
        if list(encoder.get("source_datasets") or []) != [dataset]:
            problems.append(f"model.encoders.{name}.source_datasets={encoder.get('source_datasets')}")
    for name, decoder in decoders.items():
        if list(decoder.get("target_node_features") or ["encoded_data"]) != ["encoded_data"]:
            features = decoder.get("target_node_features")
            problems.append(f"model.decoders.{name}.target_node_features={features} (only [encoded_data])")
    residual = ((model.get("residual") or {}).get("datasets") or {}).get(dataset) or {}
    if residual.get("_target_", SKIP) != SKIP or residual.get("step", -1) != -1:
        problems.append(
            f"model.residual={residual} (only SkipConnection from the last input step; TruncatedConnection is not read)"
        )
    aggregator = (model.get("latent_aggregator") or {}).get("_target_", "")
    if not aggregator.endswith(("SumAggregator", "MeanAggregator")):
        problems.append(f"model.latent_aggregator={aggregator}")
    mask = ((model.get("output_mask") or {}).get("datasets") or {}).get(dataset) or {}
    if not str(mask.get("_target_", "NoOutputMask")).endswith("NoOutputMask"):
        problems.append(f"model.output_mask={mask.get('_target_')} (only NoOutputMask)")
    return problems


def _processor_entries(data: dict[str, Any], dataset: str, problems: list[str]) -> tuple[tuple[str, str, dict], ...]:
    entries = []
    processors = (((data.get("datasets") or {}).get(dataset) or data).get("processors")) or {}
    for name, entry in processors.items():
        target = entry.get("_target_")
        config = entry.get("config") or {}
        if (target == NORMALIZER and not config.get("remap")) or target in IMPUTERS:
            entries.append((name, target, config))
        else:
            what = "remap" if target == NORMALIZER else target
            problems.append(f"data processor {name} ({what}; only {NORMALIZER} and the Input/Constant imputers)")
    if not any((entry or {}).get("_target_") == NORMALIZER for entry in processors.values()):
        problems.append("no InputNormalizer among the data processors")
    return tuple(entries)


def _boundings(model: dict[str, Any], dataset: str, problems: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found = []
    for entry in ((model.get("bounding") or {}).get("datasets") or {}).get(dataset) or []:
        target = entry.get("_target_")
        if target not in FLOORS:
            problems.append(
                f"model.bounding {target} on {entry.get('variables')} (only ReluBounding and NormalizedReluBounding)"
            )
        found.append((str(target), tuple(entry.get("variables") or ())))
    return tuple(found)


def _timestep(config: dict[str, Any]) -> str:
    task, data = config.get("task") or {}, config.get("data") or {}
    return str(task.get("timestep") or data.get("timestep") or data.get("frequency") or "6h").lower()


def read_spec(archive: AnemoiArchive) -> AnemoiSpec:
    """The model ``archive`` holds; :class:`ImportRefused` lists every option of it we do not reproduce."""
    models_version, training_version = _versions(archive)
    config, path = archive.metadata.get("config") or {}, archive.path
    datasets = list((archive.metadata.get("data_indices") or {}).keys())
    if not datasets:
        raise ImportRefused(f"{path}: its metadata holds no data_indices; a layout anemo-import does not know")
    dataset, model, task = datasets[0], config.get("model") or {}, config.get("task") or {}
    problems = _model_problems(model, dataset)
    if len(datasets) > 1:
        problems.insert(0, f"data_indices of {len(datasets)} datasets {datasets} (multi-dataset models are not read)")
    if task.get("_target_", FORECASTER) != FORECASTER:
        problems.append(f"task {task.get('_target_')} (only {FORECASTER}: ensemble and diffusion tasks are not read)")
    encoder = next(iter((model.get("encoders") or {}).values()), {}).get("mapper") or {}
    decoder = next(iter((model.get("decoders") or {}).values()), {}).get("mapper") or {}
    processor = model.get("processor") or {}
    mappers = "anemoi.models.layers.mapper.GraphTransformer{}Mapper"
    problems += _block_problems("model.encoders.0.mapper", encoder, mappers.format("Forward"))
    problems += _block_problems(
        "model.processor", processor, "anemoi.models.layers.processor.GraphTransformerProcessor"
    )
    problems += _block_problems("model.decoders.0.mapper", decoder, mappers.format("Backward"))
    parts = {"encoder": encoder, "processor": processor, "decoder": decoder}
    shared = {
        key: _same({k: p.get(key) for k, p in parts.items()}, key, problems)
        for key in ("num_channels", "num_heads", "mlp_hidden_ratio", "trainable_size")
    }
    attributes = _same(
        {k: tuple(p.get("sub_graph_edge_attributes") or ()) for k, p in parts.items()},
        "sub_graph_edge_attributes",
        problems,
    )
    hidden = (model.get("model") or {}).get("hidden_nodes_name", "hidden")
    nodes = model.get("node_trainable_parameters") or {}
    trainable_nodes = _same(
        {name: nodes.get(name, 0) for name in (dataset, hidden)}, "node_trainable_parameters", problems
    )
    boundings = _boundings(model, dataset, problems)
    processors = _processor_entries(config.get("data") or {}, dataset, problems)
    if problems:
        raise ImportRefused(f"{path} uses what anemo-import does not reproduce: {'; '.join(problems)}")
    return AnemoiSpec(
        dataset=dataset,
        hidden=hidden,
        num_channels=int(shared["num_channels"]),
        num_heads=int(shared["num_heads"]),
        mlp_hidden_ratio=float(shared["mlp_hidden_ratio"]),
        num_layers=int(processor.get("num_layers", 16)),
        trainable_nodes=int(trainable_nodes),
        trainable_edges=int(shared["trainable_size"] or 0),
        latent_skip=bool((model.get("model") or {}).get("latent_skip", model.get("latent_skip", True))),
        edge_attributes=tuple(attributes),
        multistep_input=int(task.get("multistep_input", 1)),
        multistep_output=int(task.get("multistep_output", 1)),
        timestep=_timestep(config),
        boundings=boundings,
        processors=processors,
        models_version=models_version,
        training_version=training_version,
    )

"""An anemoi checkpoint in, our ``inference.pt`` out: read without running pickled code, every option checked first,
nothing written on a refusal."""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import anemo_like
from anemo_like.anemoi_import.archive import AnemoiArchive, ImportRefused, read_archive
from anemo_like.anemoi_import.content import read_content
from anemo_like.anemoi_import.graph import anemoi_graph
from anemo_like.anemoi_import.output import output_file
from anemo_like.anemoi_import.run_config import imported_run_config
from anemo_like.anemoi_import.spec import AnemoiSpec, read_spec
from anemo_like.anemoi_import.variables import normalizer, variable_layout, variable_map
from anemo_like.anemoi_import.weights import our_state_dict
from anemo_like.checkpoints.inference import save_inference_checkpoint
from anemo_like.models.forecast_model import ForecastModel

LOG = logging.getLogger(__name__)
COORDINATE_TOLERANCE_DEG = 1e-4


@dataclass(frozen=True)
class ImportReport:
    """What was imported: the written file, the model's size and variables."""

    output: Path
    spec: AnemoiSpec
    parameters: int
    grid_points: int
    inputs: list[str]
    outputs: list[str]


def provenance(archive: AnemoiArchive, spec: AnemoiSpec) -> dict[str, Any]:
    """Where the weights come from, stored in the inference checkpoint."""
    metadata = archive.metadata
    return {
        "source": "anemoi",
        "file": str(archive.path.resolve()),
        "sha256": archive.sha256,
        "kind": archive.kind,
        "anemoi_models": spec.models_version,
        "anemoi_training": spec.training_version,
        "run_id": metadata.get("run_id"),
        "uuid": metadata.get("uuid"),
        "trained_at": metadata.get("timestamp"),
        "imported_by": f"anemo_like {anemo_like.__version__}",
        "imported_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _variables_metadata(metadata: dict[str, Any], names: list[str]) -> dict[str, dict[str, Any]]:
    """The training dataset's ``variables_metadata`` entries (units, MARS keys) of ``names``, where it recorded them."""
    found: dict[str, Any] = {}

    def search(node: Any) -> None:
        if isinstance(node, dict):
            entry = node.get("variables_metadata")
            if isinstance(entry, dict):
                found.update({k: v for k, v in entry.items() if isinstance(v, dict) and k not in found})
            for value in node.values():
                search(value)

    search(metadata.get("dataset") or {})
    return {name: found[name] for name in names if name in found}


def _check_grid(archive: AnemoiArchive, dataset: str, latlon_rad: np.ndarray) -> None:
    """The graph's data nodes must be the grid of the supporting arrays (latitudes, longitudes), where stored."""
    lat, lon = (
        archive.supporting_arrays.get(f"{dataset}/latitudes"),
        archive.supporting_arrays.get(f"{dataset}/longitudes"),
    )
    if lat is None or lon is None:
        return
    grid = np.rad2deg(latlon_rad.astype(np.float64))
    if lat.shape[0] != grid.shape[0]:
        raise ImportRefused(f"{archive.path}: its graph has {grid.shape[0]} data nodes, its grid {lat.shape[0]} points")
    worst = max(np.abs(lat - grid[:, 0]).max(), np.abs((lon - grid[:, 1] + 180.0) % 360.0 - 180.0).max())
    if worst > COORDINATE_TOLERANCE_DEG:
        raise ImportRefused(f"{archive.path}: its graph's data nodes differ from its grid by up to {worst:.3g} degrees")


def import_checkpoint(source: Path, output: Path) -> ImportReport:
    """Import ``source`` (an anemoi ``inference-*.ckpt`` or ``last.ckpt``) into ``output`` (a ``.pt`` file or a
    folder for ``inference.pt``); :class:`ImportRefused` names what is not taken, and then nothing is written."""
    target = output_file(output)
    LOG.info("reading %s without running its pickled code", source)
    archive = read_archive(source)
    spec = read_spec(archive)
    content = read_content(archive, spec.dataset)
    variables = variable_map(archive.metadata, spec, content)
    layout = variable_layout(spec, content, variables)
    LOG.info("anemoi-models %s, %s: building our model on anemoi's graph", spec.models_version, archive.kind)
    graph, perms = anemoi_graph(content, spec)
    _check_grid(archive, spec.dataset, graph["data"].x.numpy())
    config = imported_run_config(
        archive.metadata.get("config") or {}, spec, variables, output=target.parent, imputed=bool(layout.imputed)
    )
    with torch.device("meta"):  # no second copy of the weights: anemoi's tensors take the parameters' place
        model = ForecastModel(
            config=config.model,
            graph=graph,
            layout=layout,
            multistep=spec.multistep_input,
            output_steps=spec.multistep_output,
        )
    state = our_state_dict(content.tensors, spec, variables, perms)
    expected = dict(model.named_parameters()) | {n: b for n, b in model.named_buffers() if n.endswith("position")}
    mismatched = [
        f"{n} {tuple(state[n].shape)} != {tuple(t.shape)}"
        for n, t in expected.items()
        if n in state and state[n].shape != t.shape
    ]
    missing = sorted(set(expected) - set(state))
    if mismatched or missing:
        raise ImportRefused(
            f"{source}: its weights do not fit the model its config describes ({'; '.join(mismatched + missing)[:500]})"
        )
    model.load_state_dict(state, strict=False, assign=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    LOG.info("writing %s", target)
    save_inference_checkpoint(
        target,
        model=model,
        config=config,
        roles=variables.roles,
        normalizer=normalizer(variables, content),
        graph=graph,
        variables_metadata=_variables_metadata(archive.metadata, variables.roles.sample),
        provenance=provenance(archive, spec),
    )
    return ImportReport(
        output=target,
        spec=spec,
        parameters=sum(p.numel() for p in model.parameters()),
        grid_points=graph["data"].num_nodes,
        inputs=variables.roles.input,
        outputs=variables.roles.output,
    )

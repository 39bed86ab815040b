#!/usr/bin/env python3
"""anemoi's side of ``benchmarks/anchor/import_big.py``, run in the anchor venv (anemoi-models 0.19, anemoi-graphs,
anemoi-utils; ``bash ../shared/bench/anchor/setup.sh``). Two commands, each one fresh process:

``build``: the anchor's graph (``../shared/bench/anchor/run.py``, anemoi-training's ``multi_scale.yaml``) on the
points of ``--inputs``, the anchor's ``AnemoiModelEncProcDec`` config (``gpu_anchor_model.model_config``: anemoi's
``graphtransformer.yaml`` at the given sizes, ReluBounding on ``tp``) wrapped in an ``AnemoiModelInterface`` with a
mean-std ``InputNormalizer`` over the statistics of ``--inputs``, random weights (the trainable node and edge
tensors too), written as anemoi-training's checkpoint callback writes ``inference-*.ckpt``: ``torch.save`` of the
interface, then ``anemoi.utils.checkpoints.save_metadata`` with the metadata and the supporting arrays.

``run``: ``torch.load`` of that file, ``predict_step`` from the first ``multistep`` states of ``--inputs``, each
prediction fed back as the newest input state (all variables are prognostic), ``--steps`` times, fp32; the
``ANEMOI_INFERENCE_NUM_CHUNKS*`` variables come from the environment (anemoi-models reads them at import). Saves the
outputs, (steps, grid, variables) physical, and prints one JSON line: wall and CPU seconds of the load and of the
forecast, per-step wall seconds, and the process's VmHWM at the end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: benchmarks.* importable

from benchmarks.anchor.anchor_grid import harness
from benchmarks.script_runs import cpu_s, status_mib

CHUNK_VARIABLES = (
    "ANEMOI_INFERENCE_NUM_CHUNKS",
    "ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER",
    "ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR",
)
NORMALIZER = "anemoi.models.preprocessing.normalizer.InputNormalizer"
DATASET = "data"


def primitives(value: Any) -> Any:
    """JSON-ready copy of the metadata (tensors and arrays as lists), as anemoi-training's map_config_to_primitives."""

    def default(obj: Any) -> Any:
        if hasattr(obj, "tolist"):
            return obj.tolist()
        if isinstance(obj, (datetime.date, datetime.datetime)):
            return obj.isoformat()
        return str(obj)

    return json.loads(json.dumps(value, default=default))


def full_config(args: argparse.Namespace, names: list[str], dates: list[str]) -> Any:
    """anemoi-training's config as the checkpoint records it: the anchor's model section, a one-dataset data section
    (mean-std normaliser, no forcings or diagnostics), the forecaster task, where the data came from."""
    from omegaconf import OmegaConf

    from benchmarks.gpu.gpu_anchor_model import model_config

    model_args = argparse.Namespace(
        channels=args.channels,
        layers=args.layers,
        heads=args.heads,
        mlp_hidden_ratio=4.0,
        processor="graphtransformer",
        backend="triton",  # anemoi's default; anemoi-models falls back to pyg without CUDA
        no_grad_checkpointing=False,
        num_chunks_mapper=4,  # graphtransformer.yaml's mapper num_chunks
        num_chunks_processor=4 if args.layers % 4 == 0 else 1,
        node_trainable=8,
        edge_trainable=8,
    )
    cfg = model_config(model_args)
    window = {"start": dates[0], "end": dates[-1], "frequency": "6h", "dataset": args.dataset}
    extra = {
        "data": {
            "format": "zarr",
            "frequency": "6h",
            "datasets": {
                DATASET: {
                    "forcing": [],
                    "diagnostic": [],
                    "target": None,
                    "processors": {"normalizer": {"_target_": NORMALIZER, "config": {"default": "mean-std"}}},
                }
            },
        },
        "task": {
            "_target_": "anemoi.training.tasks.Forecaster",
            "multistep_input": args.multistep,
            "multistep_output": 1,
            "timestep": "6H",
            "rollout": {"start": 1, "epoch_increment": 0, "maximum": 1},
        },
        "system": {"input": {"dataset": args.dataset}},
        "dataloader": {"training": {"datasets": {DATASET: window}}, "validation": {"datasets": {DATASET: window}}},
        "training": {"precision": "32"},
    }
    return OmegaConf.merge(cfg, OmegaConf.create(extra))


def metadata_of(cfg: Any, indices: Any, names: list[str], inputs: Any, args: argparse.Namespace) -> dict[str, Any]:
    """The metadata anemoi-training's trainer, datamodule and task fill (what an importer or anemoi-inference reads)."""
    from anemoi.utils.provenance import gather_provenance_info
    from omegaconf import OmegaConf

    run_id, dates = str(uuid.uuid4()), [str(d) for d in inputs["dates"]]
    name_to_index = {name: i for i, name in enumerate(names)}
    timesteps = {
        "relative_date_indices_training": list(range(args.multistep + 1)),
        "input_relative_date_indices": list(range(args.multistep)),
        "output_relative_date_indices": [args.multistep],
        "timestep": "6h",
    }
    dataset = {
        "version": "0.5.47",
        "frequency": "6h",
        "variables": names,
        "variables_metadata": {name: {"units": "1"} for name in names},
        "shape": [len(dates), len(names), 1, int(inputs["latitudes"].size)],
        "dtype": "float32",
        "start_date": dates[0],
        "end_date": dates[-1],
        "arguments": {"args": [{"dataset": args.dataset, "frequency": "6h"}], "kwargs": {}},
        "supporting_arrays": ["latitudes", "longitudes"],
    }
    return primitives(
        {
            "version": "2.0",
            "config": OmegaConf.to_container(cfg, resolve=True),
            "seed": args.seed,
            "base_seed": args.seed,
            "run_id": run_id,
            "task": "forecaster",
            "dataset": {DATASET: dataset},
            "data_indices": {DATASET: indices.todict()},
            "provenance_training": gather_provenance_info(),
            "timestamp": datetime.datetime.now(tz=datetime.timezone.utc),
            "metadata_inference": {
                "seed": args.seed,
                "base_seed": args.seed,
                "run_id": run_id,
                "dataset_names": [DATASET],
                "task": "forecaster",
                DATASET: {
                    "data_indices": {"input": name_to_index, "output": name_to_index},
                    "variable_types": {"forcing": [], "target": [], "prognostic": names, "diagnostic": []},
                    "timesteps": timesteps,
                },
            },
            "uuid": str(uuid.uuid4()),
            "training": {"current_epoch": 0, "global_step": 0, "elapsed_time": 0.0},
        }
    )


def build(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from anemoi.models.data_indices.collection import IndexCollection
    from anemoi.models.interface import AnemoiModelInterface
    from anemoi.utils.checkpoints import save_metadata
    from omegaconf import OmegaConf

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    with np.load(args.inputs) as stored:
        inputs = {key: stored[key] for key in stored.files}
    lat, lon = inputs["latitudes"], inputs["longitudes"]
    names = [str(name) for name in inputs["names"]]
    anchor = harness()
    assert names == anchor.variable_names(len(names)), "the variables must be the anchor's names (tp, var_1, ...)"
    anchor.parse_grid = lambda name: (f"{lat.size} points", lat.size, 0)  # as benchmarks/anchor/anchor_grid.py does
    anchor.data_coordinates = lambda kind, n1, n2: (lat, lon)
    graph_args = argparse.Namespace(
        grid="points",
        mesh_res=args.mesh_res,
        cutoff_factor=0.6,
        knn=3,
        x_hops=1,
        no_area_weights=False,
        processor="graphtransformer",
    )
    graph = anchor.build_graph(graph_args)
    t_graph = time.perf_counter()
    cfg = full_config(args, names, [str(d) for d in inputs["dates"]])
    indices = IndexCollection(OmegaConf.create({"forcing": [], "diagnostic": []}), {n: i for i, n in enumerate(names)})
    statistics = {DATASET: {key: inputs[key] for key in ("mean", "stdev", "minimum", "maximum")}}
    metadata = metadata_of(cfg, indices, names, inputs, args)
    interface = AnemoiModelInterface(
        config=cfg,
        n_step_input=args.multistep,
        n_step_output=1,
        graph_data=graph,
        statistics=statistics,
        data_indices={DATASET: indices},
        metadata=metadata,
        supporting_arrays={DATASET: {"latitudes": lat.astype(np.float64), "longitudes": lon.astype(np.float64)}},
    )
    with torch.no_grad():  # the trainable node and edge features start at zero in anemoi: random, so they matter
        trainable = [p for name, p in interface.named_parameters() if name.endswith(".trainable")]
        for parameter in trainable:
            parameter.normal_(0.0, 1.0)
    params = sum(p.numel() for p in interface.parameters())
    metadata["model"] = {"model": "AnemoiModelInterface", "trainable_parameters": params, "total_parameters": params}
    t_model = time.perf_counter()
    # anemoi-training's AnemoiCheckpoint._save_checkpoint: config, metadata and arrays out of the pickle, then in
    metadata, arrays = interface.metadata, interface.supporting_arrays
    interface.config, interface.metadata, interface.supporting_arrays = None, None, None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(interface, out)
    save_metadata(str(out), metadata, supporting_arrays=arrays)
    t_saved = time.perf_counter()
    summary = anchor.graph_summary(graph)
    return {
        "checkpoint": str(out),
        "file_mib": round(out.stat().st_size / 2**20, 1),
        "params": params,
        "trainable_tensors_randomised": len(trainable),
        "graph": {k: summary[k] for k in summary if k != "edge_attr_dim"},
        "graph_s": round(t_graph - t0, 1),
        "model_s": round(t_model - t_graph, 1),
        "save_s": round(t_saved - t_model, 1),
        "peak_mib": round(status_mib()),
        "anemoi_models": __import__("anemoi.models").models.__version__,
        "provenance_models": metadata["provenance_training"]["module_versions"].get("anemoi.models"),
    }


def effective_chunks(model: Any) -> dict[str, Any]:
    """The chunk counts anemoi-models uses in eval mode: a mapper max(its num_chunks, ..._MAPPER), each processor
    layer ..._PROCESSOR edge blocks."""
    from anemoi.models.layers import block, mapper

    mappers = {
        name.rsplit(".", 2)[-2]: max(module.num_chunks, mapper.NUM_CHUNKS_INFERENCE_MAPPER)
        for name, module in model.named_modules()
        if type(module).__name__.startswith("GraphTransformer") and type(module).__name__.endswith("Mapper")
    }
    return {"mappers": mappers, "processor": block.NUM_CHUNKS_INFERENCE_PROCESSOR}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import numpy as np
    import torch
    from anemoi.models.interface import AnemoiModelInterface  # noqa: F401  (imported before the clock starts)

    torch.set_num_threads(args.threads)
    chunks = {name: os.environ[name] for name in CHUNK_VARIABLES if os.environ.get(name)}
    imports_mib, t0 = status_mib("VmRSS"), time.perf_counter()
    model = torch.load(args.checkpoint, weights_only=False, map_location="cpu")  # our own file: trusted
    model.eval()
    loaded_mib = status_mib("VmRSS")
    with np.load(args.inputs) as stored:
        values = stored["values"]  # (dates, variables, grid) physical, the model's variable order
    multistep = model.n_step_input
    x = torch.from_numpy(np.ascontiguousarray(values[:multistep].transpose(0, 2, 1)))[None]  # (1, time, grid, vars)
    t1, c1 = time.perf_counter(), cpu_s()
    outputs, step_s = [], []
    for _ in range(args.steps):
        start = time.perf_counter()
        y = model.predict_step({"data": x.clone()})["data"]  # (batch, time, ensemble, grid, variables)
        state = y[0, 0, 0]
        outputs.append(state.numpy().copy())
        x = torch.cat([x[:, 1:], state[None, None]], dim=1)
        step_s.append(round(time.perf_counter() - start, 2))
    np.save(args.out, np.stack(outputs))
    t2, c2 = time.perf_counter(), cpu_s()
    return {
        "system": "anemoi-models",
        "chunks": chunks,
        "effective_chunks": effective_chunks(model),
        "threads": torch.get_num_threads(),
        "steps": args.steps,
        "load_wall_s": round(t1 - t0, 2),
        "forecast_wall_s": round(t2 - t1, 2),
        "forecast_cpu_s": round(c2 - c1, 2),
        "total_wall_s": round(t2 - t0, 2),
        "step_wall_s": step_s,
        "peak_mib": round(status_mib()),
        "imports_mib": round(imports_mib),
        "loaded_mib": round(loaded_mib),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="write the anemoi inference checkpoint")
    b.add_argument("--inputs", required=True, help=".npz of import_big.py: grid, names, dates, values, statistics")
    b.add_argument("--out", required=True, help="the inference-*.ckpt to write")
    b.add_argument("--dataset", required=True, help="the zarr recorded in the metadata as the training data")
    b.add_argument("--channels", type=int, default=1024)
    b.add_argument("--layers", type=int, default=16)
    b.add_argument("--heads", type=int, default=16)
    b.add_argument("--mesh-res", type=int, default=5)
    b.add_argument("--multistep", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, default=1)
    r = commands.add_parser("run", help="forecast with anemoi's predict_step")
    r.add_argument("--checkpoint", required=True)
    r.add_argument("--inputs", required=True)
    r.add_argument("--out", required=True, help=".npy of the outputs (steps, grid, variables)")
    r.add_argument("--steps", type=int, default=4)
    r.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    result = build(args) if args.command == "build" else run(args)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

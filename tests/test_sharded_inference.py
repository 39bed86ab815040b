"""``anemo-infer`` on several ranks (gloo, the torchrun convention): sharded model copies and date-parallel copies
write the forecast file one process writes."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr
from bad_input_helpers import TINY_DATA, tiny_dataset
from distributed_checks import free_port
from test_data_parallel import wait_all

from anemo_like.training.trainer import Trainer

SIX_DATES = ["2000-01-03T18", "2000-01-04T00", "2000-01-04T06", "2000-01-04T12", "2000-01-04T18", "2000-01-05T00"]
FIVE = SIX_DATES[1:]  # 6 and 5 initial dates: even and uneven over 2 copies
FOUR_HEADS = ["model.num_channels=16", "model.num_heads=4"]
MEMORY_LINE = re.compile(
    r"rank (?P<rank>\d+): peak memory (?P<peak>\d+) MiB \(forecasts: \+(?P<forecast>-?\d+) MiB above the loaded "
    r"model; run: \+(?P<above>\d+) MiB above the (?P<runtime>\d+) MiB after imports\)"
)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, compose_run) -> dict[str, Path]:
    """A 2-step model of the tiny dataset (4 heads), saved with edge sharding and with head sharding."""
    folder = tmp_path_factory.mktemp("sharded-inference")
    dataset = tiny_dataset(folder / "tiny.zarr")
    overrides = [f"data.dataset={dataset}", *TINY_DATA, *FOUR_HEADS, "model.processor.num_layers=2"]
    outputs = Trainer(compose_run(folder / "run", overrides)).fit()
    state = torch.load(outputs.inference_checkpoint, weights_only=True)
    found = {"dataset": dataset}
    for strategy in ("edges", "heads"):
        config = json.loads(state["config"])
        for component in ("encoder", "processor", "decoder"):
            config["model"][component]["shard_strategy"] = strategy  # how the model runs, not its weights
        found[strategy] = folder / f"{strategy}.pt"
        torch.save({**state, "config": json.dumps(config)}, found[strategy])
    return found


def launch_infer(tmp_path: Path, name: str, checkpoint: Path, dataset: Path, *, world: int, per_copy: int = 1,
                 env: dict[str, str] | None = None, dates: list[str] = FIVE) -> list[subprocess.Popen]:  # fmt: skip
    """anemo-infer on ``world`` ranks writing ``tmp_path/name.nc``."""
    output = tmp_path / f"{name}.nc"
    port = free_port()
    processes = []
    for rank in range(world):
        variables = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID")}
        variables.update(env or {}, OMP_NUM_THREADS="1")
        if world > 1:
            variables.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                             MASTER_PORT=str(port))  # fmt: skip
        command = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={checkpoint}", f"dataset={dataset}",
                   f"dates=[{','.join(dates)}]", "lead_time=18h", f"output={output}", "device=cpu",
                   f"num_gpus_per_model={per_copy}",
                   f"hydra.run.dir={tmp_path / f'{name}-hydra-{rank}'}"]  # fmt: skip
        processes.append(subprocess.Popen(command, env=variables, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))  # fmt: skip
    return processes


def infer(tmp_path: Path, name: str, checkpoint: Path, dataset: Path, *, world: int, per_copy: int = 1,
          env: dict[str, str] | None = None, dates: list[str] = FIVE) -> xr.Dataset:  # fmt: skip
    """anemo-infer on ``world`` ranks; the written forecast, loaded. Every rank logs its place."""
    processes = launch_infer(tmp_path, name, checkpoint, dataset, world=world, per_copy=per_copy, env=env, dates=dates)
    for rank, (code, output_text) in enumerate(wait_all(processes, 240)):
        assert code == 0 and "Traceback" not in output_text, output_text[-3000:]
        if world > 1:
            copy, shard = divmod(rank, per_copy)
            place = f"rank {rank} of {world}: model copy {copy} of {world // per_copy}, shard {shard} of {per_copy}"
            assert place in output_text, output_text[-3000:]
        memory = MEMORY_LINE.search(output_text)  # the benchmark's figures (MiB, each rounded)
        assert memory and int(memory["rank"]) == rank, output_text[-3000:]
        peak, runtime, above, forecast = (int(memory[key]) for key in ("peak", "runtime", "above", "forecast"))
        assert abs(peak - runtime - above) <= 1 and above + 1 >= forecast >= 0, memory[0]
    return xr.open_dataset(tmp_path / f"{name}.nc").load()


def assert_same_forecast(got: xr.Dataset, expected: xr.Dataset) -> None:
    """Equal within 1e-5 relative (of each variable's largest value) at every date and lead."""
    expected = expected.sel(time=got["time"])
    assert list(got.data_vars) == list(expected.data_vars)
    np.testing.assert_array_equal(got["time"].values, expected["time"].values)
    for name in expected.data_vars:
        scale = float(np.abs(expected[name].values).max())
        np.testing.assert_allclose(got[name].values, expected[name].values, rtol=1e-5, atol=1e-5 * scale, err_msg=name)


def test_sharded_and_date_parallel_forecasts_equal_one_process(tmp_path, checkpoints) -> None:
    dataset = checkpoints["dataset"]
    single = infer(tmp_path, "single", checkpoints["edges"], dataset, world=1, dates=SIX_DATES)
    assert single.sizes["time"] == 6 and single.sizes["step"] == 3
    cases = {
        "2 shards, edges": (checkpoints["edges"], 2, 2, None),
        "2 shards, heads, chunked": (checkpoints["heads"], 2, 2, {"ANEMOI_INFERENCE_NUM_CHUNKS": "2"}),
        "2 copies": (checkpoints["edges"], 2, 1, None),
        "4 shards, heads": (checkpoints["heads"], 4, 4, None),
        "4 shards, edges, chunked": (checkpoints["edges"], 4, 4, {"ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER": "4"}),
        "2 copies x 2 shards": (checkpoints["heads"], 4, 2, None),
        "2 copies x 2 shards, 6 dates": (checkpoints["edges"], 4, 2, None),
    }
    for name, (checkpoint, world, per_copy, env) in cases.items():
        dates = SIX_DATES if "6 dates" in name else FIVE
        got = infer(tmp_path, name.replace(" ", "-").replace(",", ""), checkpoint, dataset, world=world,
                    per_copy=per_copy, env=env, dates=dates)  # fmt: skip
        assert got.sizes["time"] == len(dates), name
        assert_same_forecast(got, single)


def test_a_model_of_two_output_steps_sharded_equals_one_process(tmp_path, checkpoints, compose_run) -> None:
    """training.multistep_output=2: 3 leads are 2 forward passes, the second cut to one state, on 2 shards too."""
    overrides = [f"data.dataset={checkpoints['dataset']}", *TINY_DATA, *FOUR_HEADS, "training.multistep_output=2",
                 "training.rollout.start=2", "training.rollout.max=2", "training.val_rollout=3"]  # fmt: skip
    model = Trainer(compose_run(tmp_path / "run", overrides)).fit().inference_checkpoint
    single = infer(tmp_path, "single", model, checkpoints["dataset"], world=1)
    assert single.sizes["step"] == 3
    assert_same_forecast(infer(tmp_path, "sharded", model, checkpoints["dataset"], world=2, per_copy=2), single)


def test_a_failing_rank_stops_every_rank_and_leaves_the_old_forecast(tmp_path, checkpoints) -> None:
    """Copy 1 of 2 reads a damaged chunk (its last date); both ranks stop with status 1, the message once."""
    dataset = tmp_path / "damaged.zarr"
    shutil.copytree(checkpoints["dataset"], dataset)
    chunk = dataset / "data" / "18.0.0.0"  # 2000-01-05T12: a lead of the last two dates, read only by copy 1
    chunk.write_bytes(chunk.read_bytes()[:20])
    old = infer(tmp_path, "forecast", checkpoints["edges"], checkpoints["dataset"], world=1)
    before = (tmp_path / "forecast.nc").read_bytes()
    started = time.monotonic()
    results = wait_all(launch_infer(tmp_path, "forecast", checkpoints["edges"], dataset, world=2), 120)
    assert time.monotonic() - started < 60
    outputs = [text for _, text in results]
    assert [code for code, _ in results] == [1, 1], outputs
    message = f"CorruptDatasetError: {chunk}: cannot decode this chunk of array 'data'"
    assert sum(text.count(message) for text in outputs) == 1, outputs
    assert (
        "anemo-infer failed: PeerFailed: rank 0 of 2 stopped: a collective failed because another rank stopped"
        in (outputs[0])
    ), outputs[0][-3000:]
    assert "Traceback" not in "".join(outputs)
    assert (tmp_path / "forecast.nc").read_bytes() == before and old.sizes["time"] == 5


def test_ranks_per_copy_follow_the_checkpoint_where_the_world_allows(checkpoints) -> None:
    from anemo_like.checkpoints.inference import load_inference_checkpoint
    from anemo_like.config.inference import validate_inference_config
    from anemo_like.inference.parallel import ranks_per_copy

    trained = load_inference_checkpoint(checkpoints["edges"]).config
    trained_with_4 = trained.model_copy(
        update={"system": trained.system.model_copy(update={"hardware": trained.system.hardware.model_copy(
            update={"num_gpus_per_model": 4})})}
    )  # fmt: skip

    def config(**keys):
        return validate_inference_config({"checkpoint": "x.pt", "output": "f.nc", "dates": ["2000-01-04T00"], **keys})

    assert ranks_per_copy(config(), trained_with_4, 8) == 4  # the checkpoint's: 2 copies of 4
    assert ranks_per_copy(config(), trained_with_4, 2) == 1  # 4 does not divide 2: 2 copies of 1
    assert ranks_per_copy(config(num_gpus_per_model=2), trained_with_4, 4) == 2  # a model of P = 4 runs with 2
    with pytest.raises(ValueError) as refused:
        ranks_per_copy(config(num_gpus_per_model=3), trained, 4)
    assert str(refused.value) == "num_gpus_per_model=3 does not divide the world size (4 ranks)"


def test_grid_blocks_of_a_window_make_the_whole_window(checkpoints) -> None:
    """The ranks' grid blocks, read one date at a time, are the whole window's columns: up to the initial date, at
    the lead times, and past the dataset's last date (its forcings repeated)."""
    import dataclasses

    from anemo_like.checkpoints.inference import load_inference_checkpoint
    from anemo_like.config.inference import validate_inference_config
    from anemo_like.inference.inputs import open_inputs
    from anemo_like.models.ops.collectives import node_shard_bounds

    bundle = load_inference_checkpoint(checkpoints["edges"])
    config = validate_inference_config({"checkpoint": str(checkpoints["edges"]), "dataset": str(checkpoints["dataset"]),
                                        "output": "f.nc", "dates": FIVE, "lead_time": "18h"})  # fmt: skip
    inputs = open_inputs(config, bundle=bundle, checkpoint=checkpoints["edges"])
    last = len(inputs.store.dates) - 1
    inputs = dataclasses.replace(inputs, init_indices=np.array([*inputs.init_indices, last]))
    points = inputs.store.shape[-1]
    for index in inputs.init_indices:
        whole = inputs.window(int(index))
        assert whole.shape == (inputs.window_shape[0], points, inputs.window_shape[1]) and whole.dtype == np.float32
        assert np.isnan(whole[inputs.multistep :, :, : len(inputs.roles.prognostic)]).all()
        blocks = []
        for start, stop in node_shard_bounds(points, 4):
            blocks.append(np.full((inputs.window_shape[0], stop - start, inputs.window_shape[1]), 7.0, np.float32))
            assert inputs.window(int(index), slice(start, stop), out=blocks[-1]) is blocks[-1]
        np.testing.assert_array_equal(np.concatenate(blocks, axis=1), whole)

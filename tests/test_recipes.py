"""Training recipes: warm start (training.init_from), freezing (training.freeze) and weight averaging (training.ema)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bad_input_helpers import Payload

from anemo_like.checkpoints.training import load_training_checkpoint
from anemo_like.config.validate import ConfigError
from anemo_like.training.trainer import Trainer

SHORT = ["diagnostics.plots=false", "training.val_every_n_steps=1000", "dataloader.limit_batches.val=1"]
FULL = "[sp, t_850, u_250, u_850, v_250, v_850, z_500]"
SYNTHETIC_DATASET = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "synthetic_dataset.py"


@pytest.fixture(scope="module")
def source(tmp_path_factory, compose_run):
    """A trained tiny model (2 steps), its inference.pt and training checkpoint."""
    folder = tmp_path_factory.mktemp("source")
    outputs = Trainer(compose_run(folder, [*SHORT, "training.max_steps=2"])).fit()
    return outputs


def parameters(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def graph_bound(names) -> set[str]:
    """The trainable node and edge features: one row per grid point, mesh node or edge."""
    return {name for name in names if name.endswith(".trainable")}


def test_warm_start_keeps_what_fits_and_reports_the_rest(tmp_path, compose_run, source, caplog) -> None:
    saved = torch.load(source.inference_checkpoint, weights_only=True)
    weights, normalizer = saved["state_dict"], saved["normalizer"]
    start = [*SHORT, "training.max_steps=1", f"training.init_from={source.inference_checkpoint}"]
    one_fewer = "data.variables.prognostic=[sp, t_850, u_250, v_250, v_850, z_500]"  # the source has u_850 too
    with caplog.at_level(logging.INFO, logger="anemo_like.training.warm_start"):
        warm = Trainer(compose_run(tmp_path / "a", [*start, one_fewer, "training.init_statistics=checkpoint"]))
    fewer = parameters(warm)
    reinitialised = {name for name, p in fewer.items() if p.shape != weights[name].shape}
    # the layers that read the inputs (2 states x 1 fewer variable) or write the outputs (1 fewer)
    assert reinitialised == {
        "encoder.embed_src.weight", "decoder.embed_dst.weight", "decoder.head.1.weight", "decoder.head.1.bias"
    }  # fmt: skip
    for name, p in fewer.items():
        if name not in reinitialised:
            assert torch.equal(p, weights[name]), name
    for name in reinitialised:
        assert f"    {name}: {list(fewer[name].shape)} != {list(weights[name].shape)}" in caplog.text
    assert f"  loaded        {len(fewer) - len(reinitialised):5d} parameters" in caplog.text
    assert "  missing           0" in caplog.text and "  unexpected        0" in caplog.text
    bound = graph_bound(fewer)  # the same graph: trained (not zero) and copied
    assert bound and all(weights[name].any() and torch.equal(fewer[name], weights[name]) for name in bound)
    assert "graphs differ" not in caplog.text

    other_mesh = parameters(Trainer(compose_run(tmp_path / "b", [*start, "graph.mesh_resolution=2"])))
    differ = {name for name, p in other_mesh.items() if p.shape != weights[name].shape}
    assert differ and differ < graph_bound(other_mesh)  # data_features.trainable: the same shape, another graph
    assert all(torch.equal(p, weights[name]) for name, p in other_mesh.items() if name not in graph_bound(other_mesh))
    assert all(not other_mesh[name].any() for name in graph_bound(other_mesh))  # freshly initialised (zeros)

    from_checkpoint = f"training.init_from={source.training_checkpoint}"
    from_training = Trainer(compose_run(tmp_path / "c", [*SHORT, "training.max_steps=1", from_checkpoint]))
    assert all(torch.equal(p, weights[n]) for n, p in parameters(from_training).items())
    assert from_training.step == 0  # optimiser, schedule and step start fresh
    assert not from_training.optimizer.state
    # statistics: init_statistics=checkpoint takes the source's, the default the new dataset's (same here)
    assert list(normalizer["names"])[:2] == ["sp", "t_850"]


def test_warm_start_from_another_grid_of_as_many_points_keeps_the_graph_bound_tensors_fresh(
    tmp_path, compose_run, source, caplog
) -> None:
    other_grid = tmp_path / "64x32.zarr"  # a regular 64x32 grid: as many points (2048) as the built-in 32x64 one
    command = [sys.executable, str(SYNTHETIC_DATASET), "--grid", "64x32", "--out", str(other_grid)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    weights = torch.load(source.inference_checkpoint, weights_only=True)["state_dict"]
    source_graph = load_training_checkpoint(source.training_checkpoint)["graph_hash"]
    bound = graph_bound(weights)
    assert bound and all(weights[name].any() for name in bound)  # trained away from their zero initialisation
    for checkpoint in (source.inference_checkpoint, source.training_checkpoint):
        caplog.clear()
        overrides = [*SHORT, "training.max_steps=1", f"data.dataset={other_grid}", f"training.init_from={checkpoint}"]
        with caplog.at_level(logging.INFO, logger="anemo_like.training.warm_start"):
            warm = Trainer(compose_run(tmp_path / checkpoint.stem, overrides))
        here = parameters(warm)
        same_shape = {name for name in bound if here[name].shape == weights[name].shape}
        assert {"data_features.trainable", "hidden_features.trainable", "decoder.edges.trainable"} <= same_shape
        assert all(not here[name].any() for name in bound), checkpoint  # not copied: zeros, as initialised
        assert all(torch.equal(p, weights[name]) for name, p in here.items() if name not in bound), checkpoint
        assert warm.graph_hash != source_graph
        assert (
            f"  graphs differ: {checkpoint} has graph {source_graph}, this run's is {warm.graph_hash}: the "
            "graph-bound parameters (trainable node and edge features) keep their fresh initialisation"
        ) in caplog.text
        assert all(f"    {name}: bound to another graph" in caplog.text for name in bound)
        assert f"  loaded        {len(here) - len(bound):5d} parameters" in caplog.text


def test_warm_start_from_a_checkpoint_recording_no_graph_keeps_the_graph_bound_tensors_fresh(
    tmp_path, compose_run, source, caplog
) -> None:
    state = torch.load(source.training_checkpoint, weights_only=True)
    del state["graph_hash"]  # as written before checkpoints recorded their graph
    older = tmp_path / "older.pt"
    torch.save(state, older)
    overrides = [*SHORT, "training.max_steps=1", f"training.init_from={older}"]
    with caplog.at_level(logging.INFO, logger="anemo_like.training.warm_start"):
        warm = Trainer(compose_run(tmp_path / "run", overrides))
    here = parameters(warm)
    bound = graph_bound(here)
    assert bound and all(not here[name].any() for name in bound)  # the same graph, but nothing says so
    assert all(torch.equal(p, state["model"][name]) for name, p in here.items() if name not in bound)
    assert (
        f"  the checkpoint {older} records no graph (this run's is {warm.graph_hash}): the graph-bound parameters "
        "(trainable node and edge features) keep their fresh initialisation"
    ) in caplog.text


def test_warm_start_refusals(tmp_path, compose_run, source) -> None:
    with pytest.raises(ConfigError, match=r"init_from .* and resume .* cannot be combined"):
        compose_run(tmp_path, [f"training.init_from={source.inference_checkpoint}",
                               f"training.resume={source.training_checkpoint}"])  # fmt: skip
    compose_run(tmp_path, [f"training.init_from={source.inference_checkpoint}", "training.resume=auto"])  # allowed
    with pytest.raises(ConfigError, match=r"rollout.max \(1\) is below multistep_output \(2\)"):
        compose_run(tmp_path, ["training.multistep_output=2"])
    missing = tmp_path / "nothing.pt"
    with pytest.raises(FileNotFoundError) as error:
        Trainer(compose_run(tmp_path / "a", [f"training.init_from={missing}"]))
    assert str(error.value) == (
        f"training.init_from: {missing} does not exist; give an inference.pt or a training checkpoint"
    )
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"format": "anemo_like-inference-v1", "state_dict": Payload()}, unsafe)
    with pytest.raises(ValueError) as error:
        Trainer(compose_run(tmp_path / "b", [f"training.init_from={unsafe}"]))
    assert str(error.value).startswith(
        f"{unsafe} is not a safe checkpoint (training.init_from): it holds pickled Python code (posix.system)"
    )
    with pytest.raises(ValueError, match=r"training checkpoint, which holds no normalisation statistics"):
        Trainer(compose_run(tmp_path / "c", [f"training.init_from={source.training_checkpoint}",
                                             "training.init_statistics=checkpoint"]))  # fmt: skip


def test_frozen_modules_do_not_move_and_have_no_optimizer_state(tmp_path, compose_run) -> None:
    with pytest.raises(ValueError) as error:
        Trainer(compose_run(tmp_path / "typo", ["training.freeze=[encoder, processor.layer.0]"]))
    assert str(error.value) == (
        "training.freeze: the model has no module 'processor.layer.0'; did you mean processor.layers.0 or "
        "processor.layers or processor.layers.0.block?"
    )
    freeze = "training.freeze=[encoder, processor.layers.0]"
    trainer = Trainer(compose_run(tmp_path, [*SHORT, "training.max_steps=5", freeze]))
    frozen = {n: p for n, p in parameters(trainer).items() if n.startswith(("encoder.", "processor.layers.0."))}
    moving = {n: p for n, p in parameters(trainer).items() if n.startswith("decoder.")}
    trainer.fit()
    after = dict(trainer.model.named_parameters())
    assert frozen and all(torch.equal(after[n], p) for n, p in frozen.items())
    assert all(not torch.equal(after[n], p) for n, p in moving.items() if not n.endswith("trainable"))
    optimised = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not any(id(after[n]) in optimised for n in frozen)
    assert not any(after[n] in trainer.optimizer.state for n in frozen)


def test_weight_average_matches_a_hand_computed_one_and_fills_inference_pt(tmp_path, compose_run) -> None:
    decay = 0.6
    trainer = Trainer(compose_run(tmp_path, [*SHORT, "training.max_steps=3", f"training.ema.decay={decay}"]))
    expected = parameters(trainer)
    batches = iter(trainer.train_loader(0))
    for _ in range(3):
        trainer.train_step(trainer.prepare_train_batch(next(batches)))
        trainer.step += 1
        trained = parameters(trainer)
        expected = {n: decay * a + (1 - decay) * trained[n] for n, a in expected.items()}
    average = trainer.average.state_dict()
    for name, value in expected.items():
        torch.testing.assert_close(average[name], value, rtol=1e-6, atol=1e-7)

    outputs = Trainer(compose_run(tmp_path / "run", [*SHORT, "training.max_steps=3", f"training.ema.decay={decay}"]))
    trained = outputs.fit()
    written = torch.load(trained.inference_checkpoint, weights_only=True)["state_dict"]
    assert all(torch.equal(written[n], a) for n, a in outputs.average.state_dict().items())
    assert any(not torch.equal(written[n], p) for n, p in outputs.model.named_parameters())  # trained != average
    assert "weight_average" in load_training_checkpoint(trained.training_checkpoint)


def test_resume_with_weight_average_is_bit_exact(tmp_path, compose_run) -> None:
    common = [*SHORT, "training.max_steps=4", "training.ema.decay=0.9", "training.checkpoint_every_n_steps=2",
              "training.checkpoint_keep_last=5"]  # fmt: skip
    straight = Trainer(compose_run(tmp_path / "straight", common))
    straight.fit()
    halfway = tmp_path / "straight" / "checkpoints" / "step-000000002.pt"
    resumed = Trainer(compose_run(tmp_path / "resumed", [*common, f"training.resume={halfway}"]))
    assert resumed.step == 2
    resumed.fit()
    finished = parameters(resumed)
    for name, a in parameters(straight).items():
        assert torch.equal(a, finished[name]), name
    for name, a in straight.average.state_dict().items():
        assert torch.equal(a, resumed.average.state_dict()[name]), name

"""A model sharded over P ranks computes what one process computes: the forward output and every parameter
gradient, for both strategies (edges, heads), both processors, with mapper and processor chunking and activation
checkpointing on, on a grid whose node counts do not divide by P.

One gloo world per size (2 and 4 spawned processes) runs every check; each rank also builds the single-process
model and compares against it. The loss is a two-step rollout (the first output fed back as input), so the
gradient through the gathered output is checked too. Gradients are reduced as the trainer does
(``GradientBuckets.average``: the mean over the world), which the sharded model's convention makes equal to the
single-process gradient.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import latlon_graph
from distributed_checks import Checks, free_port, init_gloo

from anemo_like.config.schema import ModelConfig
from anemo_like.distributed.data_parallel import GradientBuckets
from anemo_like.distributed.groups import build_process_groups
from anemo_like.distributed.parallelize import parallelize
from anemo_like.models import ForecastModel, VariableLayout

LAYOUT = VariableLayout(
    num_input=5, num_output=4, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={}
)
# (processor type, mapper strategy, processor strategy)
SETUPS = [
    ("graphtransformer", "edges", "edges"),
    ("graphtransformer", "heads", "heads"),
    ("graphtransformer", "edges", "heads"),
    ("graphtransformer", "heads", "edges"),
    ("transformer", "edges", "heads"),
    ("transformer", "heads", "heads"),
]


def make_model(
    graph, processor: str, mapper_strategy: str, processor_strategy: str, layout: VariableLayout = LAYOUT
) -> ForecastModel:
    torch.manual_seed(0)
    mapper = {"num_chunks": 2, "shard_strategy": mapper_strategy}
    config = ModelConfig.model_validate(
        {
            "num_channels": 16,
            "num_heads": 4,
            "encoder": mapper,
            "decoder": mapper,
            "processor": {
                "type": processor,
                "num_layers": 2,
                "num_chunks": 2,
                "shard_strategy": processor_strategy,
                "window_size": 6,
            },
        }
    )
    model = ForecastModel(config=config, graph=graph, layout=layout, multistep=2)
    with torch.no_grad():  # trainable features start at zero: make them matter
        for name, p in model.named_parameters():
            if "trainable" in name:
                p.normal_()
    return model


def rollout_loss(model: ForecastModel, x: torch.Tensor, weights: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Two model steps, the first output fed back as the newest input state; returns (loss, first output)."""
    first = model(x)
    newest = torch.cat([first, x[:, -1, :, LAYOUT.num_output :]], dim=-1)
    second = model(torch.cat([x[:, 1:], newest[:, None]], dim=1))
    return (first * weights[0]).sum() + (second * weights[1]).sum(), first


def check_model(check: Checks, graph, groups, setup: tuple[str, str, str]) -> None:
    name = f"P={groups.model_size} {'/'.join(setup)}"
    single = make_model(graph, *setup)
    sharded = copy.deepcopy(single)
    shard = parallelize(sharded, groups).shard
    check.true(f"{name} shard size", shard.size == groups.model_size)
    generator = torch.Generator().manual_seed(1)
    grid = graph["data"].num_nodes
    x = torch.randn(2, 2, grid, LAYOUT.num_input, generator=generator)
    weights = [torch.randn(2, grid, LAYOUT.num_output, generator=generator) for _ in range(2)]

    loss, first = rollout_loss(single, x, weights)
    loss.backward()
    gradients = GradientBuckets(sharded.parameters(), bucket_cap_mb=0.01)  # several buckets
    sharded_loss, sharded_first = rollout_loss(sharded, x, weights)
    sharded_loss.backward()
    gradients.average()

    check.close(f"{name} output", sharded_first.detach(), first.detach(), atol=1e-5 * float(first.abs().max()))
    check.close(f"{name} loss", sharded_loss.detach(), loss.detach(), atol=1e-5 * float(loss.abs()))
    reference = {n: p.grad for n, p in single.named_parameters()}
    # Errors relative to each tensor's largest entry. Key biases have zero gradient in exact arithmetic (softmax
    # is shift-invariant): what they hold is rounding, so their scale is floored at 1/10 of the largest entry.
    floor = 0.1 * max(float(g.abs().max()) for g in reference.values())
    for parameter_name, parameter in sharded.named_parameters():
        expected = reference[parameter_name]
        own = float(expected.abs().max())
        scale = max(own, floor) if "lin_key.bias" in parameter_name else own
        check.close(f"{name} grad {parameter_name}", parameter.grad, expected, atol=1e-5 * scale)
    check.true(f"{name} every parameter has a gradient", all(g is not None for g in reference.values()))

    os.environ["ANEMOI_INFERENCE_NUM_CHUNKS"] = "3"  # eval mode: other chunk counts, the same numbers
    try:
        with torch.no_grad():
            eval_single, eval_sharded = single.eval()(x), sharded.eval()(x)
    finally:
        del os.environ["ANEMOI_INFERENCE_NUM_CHUNKS"]
    check.close(f"{name} eval output", eval_sharded, eval_single, atol=1e-5 * float(eval_single.abs().max()))


def worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    check = Checks(rank, rtol=1e-5)
    graph = latlon_graph(11, 21, 1)  # 231 grid and 42 mesh nodes: uneven blocks for P = 2 and 4
    try:
        for per_model in [p for p in (2, 4) if world % p == 0]:
            groups = build_process_groups(world, rank, per_model)
            for setup in SETUPS:
                check_model(check, graph, groups, setup)
    finally:
        dist.destroy_process_group()
    assert not check.failures, "\n".join(check.failures[:20])


@pytest.mark.equivalence
@pytest.mark.parametrize("world", [2, 4])
def test_sharded_model_equals_single_process(world):
    mp.spawn(worker, args=(world, free_port()), nprocs=world, join=True)

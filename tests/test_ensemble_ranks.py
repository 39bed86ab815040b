"""Ensemble members spread over ranks compute what one process computes: the almost-fair CRPS of a two-step
rollout of M noisy members and every parameter gradient (after the trainer's world-wide average), with members
over 2 and 4 ranks, composed with model sharding (edges and heads) and with data parallelism.

One gloo world per size (2 and 4 spawned processes) runs every layout; each rank also computes the single-process
reference: all M members of each data-parallel replica's sample in one process, the replicas' losses and
gradients averaged.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import latlon_graph
from distributed_checks import Checks, free_port, init_gloo

from anemo_like.config.schema import ModelConfig
from anemo_like.distributed.groups import build_process_groups
from anemo_like.distributed.parallelize import parallelize
from anemo_like.models import ForecastModel, VariableLayout
from anemo_like.models.rollout import ForecastSpec
from anemo_like.training.ensemble import EnsembleMembers, rollout_loss
from anemo_like.training.ensemble_loss import EnsembleCRPSLoss

LAYOUT = VariableLayout(
    num_input=5, num_output=4, prognostic_input=[0, 1, 2], prognostic_output=[0, 1, 2], relu_floor={}
)
SPEC = ForecastSpec(multistep=2, input_positions=range(5), output_positions=range(4), num_prognostic=3)
MEMBERS, STEPS, SEED = 4, 2, 3
# (ranks per model, model instances per ensemble, processor type, shard strategy) for each world size
LAYOUTS = {
    2: [(1, 2, "graphtransformer", "edges"), (2, 1, "graphtransformer", "edges")],
    4: [
        (1, 4, "graphtransformer", "edges"),
        (2, 2, "graphtransformer", "edges"),
        (2, 2, "graphtransformer", "heads"),
        (2, 2, "transformer", "heads"),
        (1, 2, "graphtransformer", "heads"),  # 2 data-parallel replicas of 2-rank ensembles
    ],
}


def make_model(graph, processor: str, strategy: str) -> ForecastModel:
    torch.manual_seed(0)
    config = ModelConfig.model_validate(
        {
            "num_channels": 16,
            "num_heads": 4,
            "noise": {"channels": 4},
            "encoder": {"shard_strategy": strategy},
            "decoder": {"shard_strategy": strategy},
            "processor": {"type": processor, "num_layers": 2, "shard_strategy": strategy, "window_size": 6},
        }
    )
    model = ForecastModel(config=config, graph=graph, layout=LAYOUT, multistep=2)
    with torch.no_grad():  # zero-initialised modulation and trainable features: make them matter
        for name, p in model.named_parameters():
            if "trainable" in name or "modulation" in name:
                p.normal_(std=0.3)
    return model


def loss_and_grads(model, batch, loss_fn, members: EnsembleMembers) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss = rollout_loss(model, batch, spec=SPEC, loss_fn=loss_fn, steps=STEPS, ensemble=members, step=5)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def check_layout(check: Checks, graph, rank: int, world: int, layout: tuple[int, int, str, str]) -> None:
    per_model, per_ensemble, processor, strategy = layout
    name = f"world {world}, P={per_model}, E={per_ensemble}, {processor}/{strategy}"
    groups = build_process_groups(world, rank, per_model, None, per_ensemble)
    replicas = groups.dp_size
    generator = torch.Generator().manual_seed(1)
    grid = graph["data"].num_nodes
    batches = torch.randn(replicas, 2, SPEC.multistep + STEPS, grid, 5, generator=generator)  # 2 samples each
    loss_fn = EnsembleCRPSLoss(
        area_weight=torch.rand(grid, generator=generator) + 0.5, variable_weight=torch.rand(4, generator=generator)
    )
    single = make_model(graph, processor, strategy)
    sharded = copy.deepcopy(single)
    gradients = parallelize(sharded, groups).gradients

    losses, reference = [], {}
    for replica in range(replicas):
        whole = EnsembleMembers.of(members=MEMBERS, group=None, rank=0, size=1, seed=SEED, replica=replica)
        loss, grads = loss_and_grads(single, batches[replica], loss_fn, whole)
        losses.append(loss)
        for key, grad in grads.items():
            reference[key] = reference.get(key, 0) + grad / replicas
    mine = EnsembleMembers.of(
        members=MEMBERS,
        group=groups.ensemble_group,
        rank=groups.ensemble_rank,
        size=groups.ensemble_size,
        seed=SEED,
        replica=groups.dp_rank,
    )
    gradients.zero()
    batch = batches[groups.dp_rank]
    loss = rollout_loss(sharded, batch, spec=SPEC, loss_fn=loss_fn, steps=STEPS, ensemble=mine, step=5)
    loss.backward()
    gradients.average()

    expected = losses[groups.dp_rank]
    check.close(f"{name} loss", loss.detach(), expected, atol=1e-5 * float(expected.abs()))
    check.true(f"{name} members differ", bool(losses[0] > 0))
    # The members' losses and gradients are summed over ranks in another order than on one rank, and a gradient
    # whose entries cancel (the key bias: the softmax is shift-invariant; the noise embedding and the modulations,
    # summed over members of opposite sign) holds the rounding of the larger terms: every scale is floored at 1/10
    # of the largest gradient entry (on an AMD EPYC, heads layout: differences up to 2e-7 of that entry, in fp32).
    floor = 0.1 * max(float(g.abs().max()) for g in reference.values())
    for key, parameter in sharded.named_parameters():
        scale = max(float(reference[key].abs().max()), floor)
        check.close(f"{name} grad {key}", parameter.grad, reference[key], atol=1e-5 * scale)


def worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    check = Checks(rank, rtol=1e-5)
    graph = latlon_graph(11, 21, 1)  # 231 grid and 42 mesh nodes: uneven blocks for P = 2
    try:
        for layout in LAYOUTS[world]:
            check_layout(check, graph, rank, world, layout)
    finally:
        dist.destroy_process_group()
    assert not check.failures, "\n".join(check.failures[:20])


@pytest.mark.equivalence
@pytest.mark.parametrize("world", [2, 4])
def test_members_over_ranks_equal_one_rank(world):
    mp.spawn(worker, args=(world, free_port()), nprocs=world, join=True)

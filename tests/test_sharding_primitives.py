"""Process groups and differentiable sharding collectives, checked against dense single-process references.

One gloo world per size (2 and 4 spawned processes) runs every check. All ranks run the same collectives in the
same order; a failed comparison is recorded and raised at the end, so one bad check does not leave the other
ranks waiting (a collective that does fail times out, and mp.spawn stops the remaining ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from distributed_checks import Checks, free_port, init_gloo
from torch import Tensor

from anemo_like.distributed.groups import build_process_groups, group_layout
from anemo_like.models.ops.collectives import (
    gather_nodes,
    halo_exchange,
    heads_to_nodes,
    node_shard_bounds,
    nodes_to_heads,
    plan_halo,
)


def randn(seed: int, *shape: int) -> Tensor:
    """The same tensor on every rank for the same seed."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def sizes_of(total: int, parts: int) -> list[int]:
    return [stop - start for start, stop in node_shard_bounds(total, parts)]


# -- pure functions (no process group) --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world", "per_model", "read", "model", "data_parallel", "reader"),
    [
        (1, 1, None, [[0]], [[0]], [[0]]),
        (4, 1, None, [[0], [1], [2], [3]], [[0, 1, 2, 3]], [[0], [1], [2], [3]]),
        (4, 2, None, [[0, 1], [2, 3]], [[0, 2], [1, 3]], [[0, 1], [2, 3]]),
        (4, 4, 2, [[0, 1, 2, 3]], [[0], [1], [2], [3]], [[0, 1], [2, 3]]),
        (8, 4, 1, [[0, 1, 2, 3], [4, 5, 6, 7]], [[0, 4], [1, 5], [2, 6], [3, 7]], [[i] for i in range(8)]),
        (8, 2, 2, [[0, 1], [2, 3], [4, 5], [6, 7]], [[0, 2, 4, 6], [1, 3, 5, 7]], [[0, 1], [2, 3], [4, 5], [6, 7]]),
    ],
)
def test_group_layout(world, per_model, read, model, data_parallel, reader):
    layout = group_layout(world, per_model, read)
    assert [list(g) for g in layout.model] == model
    assert [list(g) for g in layout.data_parallel] == data_parallel
    assert [list(g) for g in layout.reader] == reader


@pytest.mark.parametrize(
    ("world", "per_model", "read", "message"),
    [
        (2, 4, None, "system.hardware.num_gpus_per_model=4 does not divide the world size (2 ranks)"),
        (4, 0, None, "system.hardware.num_gpus_per_model=0"),
        (6, 4, None, "system.hardware.num_gpus_per_model=4 does not divide the world size (6 ranks)"),
        (0, 1, None, "system.hardware.num_gpus_per_model=1 does not divide the world size (0 ranks)"),
    ],
)
def test_group_layout_rejects(world, per_model, read, message):
    with pytest.raises(ValueError) as error:
        group_layout(world, per_model, read)
    assert message in str(error.value)


def test_single_process_is_a_no_op():
    groups = build_process_groups(1, 0, 1)
    assert (groups.model_group, groups.dp_group, groups.reader_group) == (None, None, None)
    assert (groups.model_rank, groups.model_size, groups.dp_rank, groups.dp_size) == (0, 1, 0, 1)
    assert (groups.reader_rank, groups.reader_size) == (0, 1)
    x = randn(0, 2, 5, 3)
    heads = randn(1, 2, 5, 4, 3)
    assert gather_nodes(x, None, [5]) is x
    assert nodes_to_heads(heads, None, [5]) is heads
    assert heads_to_nodes(heads, None, [5]) is heads
    src = torch.tensor([4, 0, 0, 2])
    plan = plan_halo(src, node_shard_bounds(5, 1), 0, None)
    assert plan.recv_counts == [0]
    assert plan.edge_src.tolist() == [4, 0, 0, 2]
    assert halo_exchange(x, None, plan.send_index, plan.recv_counts).shape == (2, 0, 3)


def test_node_shard_bounds_are_balanced_and_padded():
    assert sizes_of(10, 4) == [3, 3, 2, 2]
    assert sizes_of(7, 2) == [4, 3]
    assert node_shard_bounds(3, 4) == [(0, 1), (1, 2), (2, 3), (3, 3)]


# -- spawned worlds -----------------------------------------------------------------------------------------------


def grads(outputs: Tensor, inputs: Tensor, upstream: Tensor) -> Tensor:
    return torch.autograd.grad(outputs, inputs, upstream)[0]


def dense_grad(x: Tensor, loss: Callable[[Tensor], Tensor]) -> Tensor:
    x = x.clone().requires_grad_()
    return torch.autograd.grad(loss(x), x)[0]


def check_gather(check: Checks, group, rank: int, parts: int, total: int, dim: int, seed: int) -> None:
    shape = [2, 3, 5]
    shape[dim] = total
    x = randn(seed, *shape)
    sizes = sizes_of(total, parts)
    start = sum(sizes[:rank])
    name = f"N={total} P={parts} dim={dim}"
    upstream = [randn(seed + 1 + r, *shape) for r in range(parts)]  # rank r's gradient of the gathered tensor

    # the loss is sum_r <gathered, g_r>; this rank's gradient is (sum_r g_r) on its block.
    x_local = x.narrow(dim, start, sizes[rank]).clone().requires_grad_()
    gathered = gather_nodes(x_local, group, sizes, dim)
    check.close(f"gather forward {name}", gathered, x)
    dense = dense_grad(x, lambda d: sum((d * g).sum() for g in upstream))
    check.close(
        f"gather backward {name}", grads(gathered, x_local, upstream[rank]), dense.narrow(dim, start, sizes[rank])
    )


def check_heads(check: Checks, group, rank: int, parts: int, total: int, seed: int) -> None:
    heads, channels = 2 * parts, 3
    x = randn(seed, 2, total, heads, channels)
    sizes = sizes_of(total, parts)
    nodes = slice(sum(sizes[:rank]), sum(sizes[: rank + 1]))
    head_block = slice(rank * heads // parts, (rank + 1) * heads // parts)
    name = f"N={total} P={parts}"
    head_upstream = [randn(seed + 1 + r, 2, total, heads // parts, channels) for r in range(parts)]
    node_upstream = [randn(seed + 20 + r, 2, sizes[r], heads, channels) for r in range(parts)]

    x_local = x[:, nodes].clone().requires_grad_()
    by_heads = nodes_to_heads(x_local, group, sizes)
    check.close(f"nodes_to_heads forward {name}", by_heads, x[:, :, head_block])
    dense = dense_grad(
        x,
        lambda d: sum(
            (d[:, :, r * heads // parts : (r + 1) * heads // parts] * g).sum() for r, g in enumerate(head_upstream)
        ),
    )
    check.close(f"nodes_to_heads backward {name}", grads(by_heads, x_local, head_upstream[rank]), dense[:, nodes])
    back = heads_to_nodes(by_heads, group, sizes)
    check.close(f"heads round trip {name}", back, x_local.detach())
    check.close(f"heads round trip backward {name}", grads(back, x_local, node_upstream[rank]), node_upstream[rank])

    x_heads = x[:, :, head_block].clone().requires_grad_()
    by_nodes = heads_to_nodes(x_heads, group, sizes)
    check.close(f"heads_to_nodes forward {name}", by_nodes, x[:, nodes])
    bounds = node_shard_bounds(total, parts)
    dense = dense_grad(x, lambda d: sum((d[:, a:b] * g).sum() for (a, b), g in zip(bounds, node_upstream, strict=True)))
    check.close(
        f"heads_to_nodes backward {name}", grads(by_nodes, x_heads, node_upstream[rank]), dense[:, :, head_block]
    )


def check_halo(check: Checks, group, rank: int, parts: int, seed: int) -> None:
    nodes, edges, channels = 30, 120, 4
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(0, nodes, (edges,), generator=generator)
    dst = torch.randint(0, nodes, (edges,), generator=generator)
    x = randn(seed + 1, 2, nodes, channels)
    bounds = node_shard_bounds(nodes, parts)
    owned = [(dst >= a) & (dst < b) for a, b in bounds]
    upstream = [randn(seed + 2 + r, 2, int(mask.sum()), channels) for r, mask in enumerate(owned)]
    start, stop = bounds[rank]

    plan = plan_halo(src[owned[rank]], bounds, rank, group)
    check.true("halo plan sends nothing to itself", len(plan.send_index[rank]) == 0 and plan.recv_counts[rank] == 0)
    x_local = x[:, start:stop].clone().requires_grad_()
    halo = halo_exchange(x_local, group, plan.send_index, plan.recv_counts)
    check.true("halo smaller than the graph", halo.shape[1] < nodes - (stop - start) or parts == 1)
    edge_features = torch.cat([x_local, halo], 1).index_select(1, plan.edge_src)
    check.close("halo forward", edge_features, x[:, src[owned[rank]]])
    dense = dense_grad(
        x, lambda d: sum((d.index_select(1, src[m]) * g).sum() for m, g in zip(owned, upstream, strict=True))
    )
    check.close("halo backward", grads(edge_features, x_local, upstream[rank]), dense[:, start:stop])


def check_groups(check: Checks, world: int, rank: int) -> list:
    """Every layout of this world; returns (per_model, model group) pairs for the primitive checks."""
    model_groups = []
    for per_model in [p for p in (1, 2, 4) if world % p == 0]:
        for read in [r for r in (1, 2, 4) if per_model % r == 0]:
            groups = build_process_groups(world, rank, per_model, read)
            layout = group_layout(world, per_model, read)
            for kind, group, group_rank, size, lists in (
                ("model", groups.model_group, groups.model_rank, groups.model_size, layout.model),
                ("dp", groups.dp_group, groups.dp_rank, groups.dp_size, layout.data_parallel),
                ("reader", groups.reader_group, groups.reader_rank, groups.reader_size, layout.reader),
            ):
                [members] = [g for g in lists if rank in g]
                name = f"{kind} group P={per_model} read={read}"
                check.true(f"{name} rank/size", (group_rank, size) == (members.index(rank), len(members)))
                check.true(f"{name} is None iff single", (group is None) == (size == 1))
                if group is not None:
                    check.true(f"{name} torch rank", dist.get_rank(group) == group_rank)
                    ranks = torch.zeros(world)
                    ranks[rank] = 1
                    dist.all_reduce(ranks, group=group)
                    check.true(f"{name} members", ranks.nonzero().flatten().tolist() == list(members))
            if read == per_model:
                model_groups.append((per_model, groups.model_group, groups.model_rank))
    return model_groups


def worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    check = Checks(rank)
    try:
        for parts, group, model_rank in check_groups(check, world, rank):
            if group is None:
                x = randn(0, 2, 5, 3)
                check.true("no-op gather", gather_nodes(x, group, [5]) is x)
                continue
            for seed, (total, dim) in enumerate([(10, 1), (7, 1), (3, 1), (9, 0), (parts + 1, 2)]):
                check_gather(check, group, model_rank, parts, total, dim, 100 * seed)
            for seed, total in enumerate([10, 7, 3]):
                check_heads(check, group, model_rank, parts, total, 2000 + 100 * seed)
            check_halo(check, group, model_rank, parts, 3000)
    finally:
        dist.destroy_process_group()
    assert not check.failures, "\n".join(check.failures)


@pytest.mark.parametrize("world", [2, 4])
def test_sharding_primitives_across_ranks(world):
    mp.spawn(worker, args=(world, free_port()), nprocs=world, join=True)

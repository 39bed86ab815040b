"""Both regional modes sharded over P = 2 ranks compute what one process computes (edges and heads strategies).

Stretched: a global grid with a denser regional box cut into it, on a mesh refined over the box. Limited area: the
regional box alone on its own mesh, rolled out with a forced boundary strip. One gloo world runs every check: the
forward output, the loss and every parameter gradient (``test_model_sharding.check_model``), and for the limited-area
model a two-step rollout whose boundary points take the forced values on every rank (and which reads them).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from distributed_checks import Checks, free_port, init_gloo
from test_model_sharding import LAYOUT, check_model, make_model

from anemo_like.config.model_schema import LimitedAreaHidden, StretchedHidden
from anemo_like.distributed.data_parallel import GradientBuckets
from anemo_like.distributed.groups import build_process_groups
from anemo_like.distributed.parallelize import parallelize
from anemo_like.graphs import build_graph
from anemo_like.models.rollout import ForecastSpec, rollout

SETUPS = [("graphtransformer", "edges", "edges"), ("graphtransformer", "heads", "heads")]


def box(step: float) -> tuple[np.ndarray, np.ndarray]:
    """Cell-centred points every ``step`` degrees in 35..70 N, 20 W..40 E."""
    lat, lon = np.meshgrid(np.arange(35 + step / 2, 70, step), np.arange(-20 + step / 2, 40, step), indexing="ij")
    return lat.ravel(), lon.ravel() % 360


def stretched_graph():
    """A 12 x 24 global grid with the box's points replaced by 7.5-degree ones; mesh levels 1 and 3."""
    lat, lon = (a.ravel() for a in np.meshgrid(90 - (np.arange(12) + 0.5) * 15, np.arange(24) * 15.0, indexing="ij"))
    inside = (lat > 35) & (lat < 70) & (((lon + 20) % 360) < 60)
    region_lat, region_lon = box(7.5)
    region = np.r_[np.ones(region_lat.size, bool), np.zeros((~inside).sum(), bool)]
    hidden = StretchedHidden(kind="stretched", global_resolution=1, region_resolution=3, margin_km=400.0)
    return build_graph(np.r_[region_lat, lat[~inside]], np.r_[region_lon, lon[~inside]], hidden=hidden, region=region)


def limited_area_graph():
    """The box alone at 5 degrees (7 x 12 points) on a level-4 mesh within 300 km of it."""
    lat, lon = box(5.0)
    return build_graph(lat, lon, hidden=LimitedAreaHidden(kind="limited_area", region_resolution=4, margin_km=300.0))


def check_forced_rollout(check: Checks, graph, groups, setup: tuple[str, str, str]) -> None:
    """A two-step rollout with the outer ring of the box forced: outputs and gradients equal one process's."""
    name = f"limited area P={groups.model_size} {'/'.join(setup)} forced rollout"
    single = make_model(graph, *setup, layout=dataclasses.replace(LAYOUT, boundary_inputs=True))
    sharded = copy.deepcopy(single)
    parallelize(sharded, groups)
    grid = graph["data"].num_nodes
    lat = graph["data"].x[:, 0]
    forced = (lat < lat.min() + 1e-3) | (lat > lat.max() - 1e-3)  # the southern and northern rows
    spec = ForecastSpec(
        multistep=2,
        input_positions=list(range(LAYOUT.num_input)),
        output_positions=list(range(LAYOUT.num_output)),
        num_prognostic=len(LAYOUT.prognostic_output),
        forced=forced,
    )
    generator = torch.Generator().manual_seed(3)
    batch = torch.randn(2, 4, grid, LAYOUT.num_input, generator=generator)
    weight = torch.randn(grid, LAYOUT.num_output, generator=generator)

    def loss_of(model) -> tuple[torch.Tensor, list[torch.Tensor]]:
        outputs = [prediction for prediction, _ in rollout(model, batch, spec, steps=2)]
        return sum((o * weight).sum() for o in outputs), outputs

    loss, outputs = loss_of(single)
    loss.backward()
    buckets = GradientBuckets(sharded.parameters(), bucket_cap_mb=0.01)
    sharded_loss, sharded_outputs = loss_of(sharded)
    sharded_loss.backward()
    buckets.average()
    for step, (mine, expected) in enumerate(zip(sharded_outputs, outputs, strict=True)):
        check.close(f"{name} step {step}", mine.detach(), expected.detach(), atol=1e-5 * float(expected.abs().max()))
        check.true(
            f"{name} step {step} boundary forced",
            torch.equal(mine[:, forced, :3], batch[:, 2 + step, forced, :3]),
        )
    reference = {n: p.grad for n, p in single.named_parameters()}
    floor = 0.1 * max(float(g.abs().max()) for g in reference.values())  # key biases: rounding (test_model_sharding)
    for parameter_name, parameter in sharded.named_parameters():
        expected = reference[parameter_name]
        own = float(expected.abs().max())
        scale = max(own, floor) if "lin_key.bias" in parameter_name else own
        check.close(f"{name} grad {parameter_name}", parameter.grad, expected, atol=1e-5 * scale)


def worker(rank: int, world: int, port: int) -> None:
    init_gloo(rank, world, port)
    check = Checks(rank, rtol=1e-5)
    try:
        groups = build_process_groups(world, rank, world)
        graphs = {"stretched": stretched_graph(), "limited area": limited_area_graph()}
        for setup in SETUPS:
            for graph in graphs.values():
                check_model(check, graph, groups, setup)
            check_forced_rollout(check, graphs["limited area"], groups, setup)
    finally:
        dist.destroy_process_group()
    assert not check.failures, "\n".join(check.failures[:20])


@pytest.mark.equivalence
def test_regional_models_sharded_equal_single_process():
    mp.spawn(worker, args=(2, free_port()), nprocs=2, join=True)

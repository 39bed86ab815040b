"""Linear weights cast once per training step (``runtime/weight_casts.py``): the forward equals autocast's bit for
bit, the gradients stay within bf16 rounding of autocast's, the parameters are back in place afterwards (also after
an error), and a step with checkpointed segments dispatches at most half the casts (a fifth at host_overhead.py's
case S)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from test_model import make_model

from anemo_like.profiling.op_count import count_ops
from anemo_like.runtime.precision import precision_plan
from anemo_like.runtime.weight_casts import linear_weights_cast_once

pytestmark = pytest.mark.equivalence

CPU = torch.device("cpu")
RECOMPUTED = {  # every part checkpointed and chunked: the recomputation casts again without the copies
    "encoder": {"num_chunks": 2, "gradient_checkpointing": True},
    "decoder": {"num_chunks": 2, "gradient_checkpointing": True},
    "processor": {"num_layers": 2, "num_chunks": 2, "gradient_checkpointing": True},
}


def step(model: torch.nn.Module, x: torch.Tensor, cast_once: bool) -> tuple[torch.Tensor, torch.Tensor, int]:
    """A bf16-autocast forward and backward: the output, all gradients flattened, and the casts dispatched."""
    model.zero_grad(set_to_none=True)
    result = {}

    def work() -> None:
        weights = linear_weights_cast_once(model, torch.bfloat16) if cast_once else contextlib.nullcontext()
        with weights:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                result["y"] = model(x)
            result["y"].float().square().mean().backward()

    counts = count_ops(work).by_name
    casts = counts["aten._to_copy.default"] + counts["aten._foreach_copy_.default"]
    gradients = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
    return result["y"].detach(), gradients, casts


@pytest.fixture(scope="module")
def inputs(small_graph) -> torch.Tensor:
    return torch.randn(2, 2, small_graph["data"].num_nodes, 5, generator=torch.Generator().manual_seed(3))


def test_same_forward_close_gradients_half_the_casts(small_graph, inputs) -> None:
    model = make_model(small_graph, **RECOMPUTED)
    y, gradients, casts = step(model, inputs, cast_once=False)
    y_once, gradients_once, casts_once = step(model, inputs, cast_once=True)
    assert torch.equal(y_once, y)
    assert float((gradients_once - gradients).norm() / gradients.norm()) < 4e-3  # bf16 sums of a few uses
    assert casts_once <= 0.5 * casts, (casts_once, casts)  # S of host_overhead.py: 112 of 614


def test_frozen_weights_are_cast_outside_autograd(small_graph, inputs) -> None:
    model = make_model(small_graph)
    model.encoder.embed_dst.requires_grad_(False)
    y, gradients, _ = step(model, inputs, cast_once=False)
    model.zero_grad(set_to_none=True)
    y_once, gradients_once, _ = step(model, inputs, cast_once=True)
    assert torch.equal(y_once, y) and model.encoder.embed_dst.weight.grad is None
    assert float((gradients_once - gradients).norm() / gradients.norm()) < 4e-3


def test_parameters_are_back_after_the_step_and_after_an_error(small_graph, inputs) -> None:
    model = make_model(small_graph)
    before = dict(model.named_parameters())
    with linear_weights_cast_once(model, torch.bfloat16):
        inside = dict(model.named_parameters())
        assert inside.keys() == before.keys() and inside["encoder.embed_dst.weight"].dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="stopped"), linear_weights_cast_once(model, torch.bfloat16):
        raise RuntimeError("stopped")
    after = dict(model.named_parameters())
    assert after.keys() == before.keys() and all(after[n] is before[n] for n in before)
    assert all(p.dtype == torch.float32 and isinstance(p, torch.nn.Parameter) for p in after.values())


def test_the_plan_casts_once_only_under_autocast_and_without_compile(small_graph) -> None:
    model = make_model(small_graph)
    for plan, swaps in (
        (precision_plan("bf16-mixed", CPU), True),
        (precision_plan("bf16-mixed", CPU, compiled=True), False),
        (precision_plan("32", CPU), False),
        (precision_plan("bf16", CPU), False),
    ):
        with plan.training_weights(model):
            assert any(p.dtype == torch.bfloat16 for p in model.parameters()) == swaps

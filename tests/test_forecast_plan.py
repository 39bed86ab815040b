"""anemo-infer's memory plan (memory_budget_gb on a CPU): weights mapped from the checkpoint and read part by part,
destination chunks of the mappers and the processor; the forecast is the same whatever the plan."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from anemoi_helpers import forecast, golden, imported

from anemo_like.checkpoints.inference import load_inference_checkpoint
from anemo_like.inference import forecast_plan
from anemo_like.runtime.weight_paging import page_weights

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="weights are paged on Linux only")


def resident_bytes(path: Path) -> int:
    """Bytes of ``path``'s mappings resident in this process (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields[0]) > 8 and ":" not in fields[0]:  # a mapping's header line
            inside = fields[-1] == str(path.resolve())
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return imported("default", tmp_path_factory.mktemp("imported"))


def test_paged_weights_give_the_same_outputs_and_are_given_back_after_each_part(checkpoint) -> None:
    bundle = load_inference_checkpoint(checkpoint)
    model = bundle.model
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    x = torch.randn(1, 2, bundle.graph["data"].num_nodes, model.layout.num_input)
    with torch.no_grad():
        resident = model(x)
        read = resident_bytes(checkpoint)  # the weights, once read, stay; and the graph's tensors the forward read
        parts = [model.encoder, *model.processor.layers, model.decoder]
        assert page_weights(model, checkpoint, parts) > 0.6 * weights  # whole pages only: not the small biases
        paged = model(x)
    assert read - resident_bytes(checkpoint) > 0.6 * weights, "paged: the weights are given back after use"
    torch.testing.assert_close(paged, resident, rtol=0, atol=0)


def test_the_plan_is_the_fastest_that_fits_and_the_forecast_is_the_same(checkpoint, tmp_path, monkeypatch) -> None:
    """Without anything else in memory (the process's own use set to 0), a budget below the resident plan's peak
    gets more chunks or paged weights, never a plan above the budget; the forecast is the unplanned one."""
    unplanned = forecast("default", checkpoint, tmp_path / "unplanned", 4)
    monkeypatch.setattr(forecast_plan, "current_memory_mib", lambda device: 0.0)
    plans = {}

    def recording(config, **kwargs):
        plans[config.memory_budget_gb] = plan = planner(config, **kwargs)
        return plan

    planner = forecast_plan.plan_forecast
    monkeypatch.setattr("anemo_like.inference.run.plan_forecast", recording)
    roomy = forecast("default", checkpoint, tmp_path / "roomy", 4, "memory_budget_gb=4")
    assert (plans[4].encoder, plans[4].processor, plans[4].decoder, plans[4].paged) == (1, 1, 1, False)
    tight_gb = plans[4].peak_bytes * 0.8 / 2**30
    tight = forecast("default", checkpoint, tmp_path / "tight", 4, f"memory_budget_gb={tight_gb}")
    plan = plans[tight_gb]
    assert plan.peak_bytes <= tight_gb * 2**30 < plans[4].peak_bytes
    assert plan.paged or plan.encoder + plan.processor + plan.decoder > 3
    for name in golden("default")["outputs"]:
        np.testing.assert_allclose(roomy[str(name)].values, unplanned[str(name)].values, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(tight[str(name)].values, unplanned[str(name)].values, rtol=1e-5, atol=1e-5)

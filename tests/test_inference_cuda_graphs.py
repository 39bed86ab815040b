"""``anemo-infer cuda_graphs=true``: refused where it cannot run, one line each, before any forecast (the replay
itself equals the eager forward on a GPU: ``tests/test_gpu.py``)."""

from __future__ import annotations

import subprocess
import sys

import torch
from inference_helpers import ERRORS_DOC

from anemo_like.config.model_schema import ModelConfig
from anemo_like.inference.captured_forward import cuda_graph_refusal

CUDA = torch.device("cuda")  # a device object only: nothing runs on it


def test_refusals_name_what_to_set() -> None:
    plain = ModelConfig()
    compiled = ModelConfig.model_validate({"compile": [{"module": "MLP"}]})
    cases = [
        (
            (plain, torch.device("cpu"), 1),
            "cuda_graphs=true needs a CUDA device and this run is on cpu; set cuda_graphs=false",
        ),
        (
            (plain, CUDA, 2),
            "cuda_graphs=true: the model is sharded over 2 ranks, whose collectives are not captured; "
            "set cuda_graphs=false or num_gpus_per_model=1",
        ),
        (
            (compiled, CUDA, 1),
            "cuda_graphs=true: the checkpoint's model.compile compiles modules, which make CUDA "
            "graphs of their own; set cuda_graphs=false",
        ),
    ]
    for (model, device, ranks), line in cases:
        assert cuda_graph_refusal(model, device, ranks) == line
        assert f"`{line}`" in ERRORS_DOC
    assert cuda_graph_refusal(plain, CUDA, 1) is None


def test_anemo_infer_on_a_cpu_exits_2_and_writes_nothing(skilled, builtin, tmp_path) -> None:
    output = tmp_path / "forecast.nc"
    result = subprocess.run(
        [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={skilled}", f"dataset={builtin}",
         "dates=[2000-01-10T00]",
         "lead_time=6h", f"output={output}", "device=cpu", "cuda_graphs=true"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    errors = [line for line in (result.stdout + result.stderr).splitlines() if "ERROR" in line or "Traceback" in line]
    assert result.returncode == 2 and len(errors) == 1, result.stdout + result.stderr
    assert errors[0].endswith("cuda_graphs=true needs a CUDA device and this run is on cpu; set cuda_graphs=false")
    assert not output.exists()

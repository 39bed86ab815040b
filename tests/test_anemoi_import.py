"""anemo-import against anemoi-models itself: small real anemoi checkpoints (tests/data/anemoi/, made by
anemoi-training with make_goldens.py) imported and run by anemo-infer give anemoi's own predict_step outputs on the
same inputs: one step within 1e-5 relative per variable, a 4-step rollout within 1e-4 (fp32, CPU)."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest
import torch
from anemoi_helpers import CASES, GOLDEN, forecast, golden, imported, relative_errors

from anemo_like.anemoi_import.archive import file_sha256
from anemo_like.checkpoints.inference import load_inference_checkpoint

ONE_STEP, ROLLOUT, STEPS = 1e-5, 1e-4, 4


@pytest.fixture(scope="module")
def imports(tmp_path_factory) -> dict:
    """Each case's inference-last.ckpt imported once."""
    folder = tmp_path_factory.mktemp("imports")
    return {case: imported(case, folder / case) for case in CASES}


@pytest.mark.equivalence
@pytest.mark.parametrize("case", CASES)
def test_anemo_infer_forecasts_what_anemoi_forecasts(case, imports, tmp_path) -> None:
    result = forecast(case, imports[case], tmp_path, STEPS)
    first = relative_errors(case, result.isel(step=slice(0, 1)), 1)
    day = relative_errors(case, result, STEPS)
    assert max(first.values()) <= ONE_STEP, first
    assert max(day.values()) <= ROLLOUT, day


def test_the_cases_exercise_what_they_claim(imports) -> None:
    """3 input and 2 output steps, a diagnostic, floors that bind, computed forcings anemoi normalised, imputers
    before and after the normaliser whose NaN come back in anemoi's output (so the comparisons above can fail)."""
    multistep = load_inference_checkpoint(imports["multistep"])
    assert (multistep.config.training.multistep_input, multistep.config.training.multistep_output) == (3, 2)
    assert multistep.roles.diagnostic == ["t_250"]
    layout, normalizer, g = multistep.model.layout, multistep.normalizer, golden("multistep")
    outputs = [str(n) for n in g["outputs"]]
    for name, floor in (("t_250", 0.0), ("u_850", None)):
        position = multistep.roles.output.index(name)
        assert floor is None or layout.relu_floor[position] == floor
        i = normalizer.names.index(name)
        normalised = (g["rollout"][..., outputs.index(name)] - normalizer.offset[i]) / normalizer.scale[i]
        assert np.isclose(normalised, layout.relu_floor[position], atol=1e-5).mean() > 0.01  # the floor binds
    forcings = load_inference_checkpoint(imports["forcings"])
    assert {"cos_julian_day", "insolation", "cos_latitude"} <= set(forcings.roles.computed)
    assert sorted(forcings.roles.input[p] for p in forcings.model.layout.imputed) == ["t_850", "z_500"]
    rollout, outputs = golden("forcings")["rollout"], [str(n) for n in golden("forcings")["outputs"]]
    assert np.isnan(rollout[:, :100, outputs.index("t_850")]).all()
    # z_500 is missing in the first input state only; anemoi restores the NaN of a pass's first input state, which
    # the rollout feeds back: missing in steps 1 and 3 (first input: the initial state, then step 1's output)
    assert np.isnan(rollout[[0, 2], 500:550, outputs.index("z_500")]).all()
    assert not np.isnan(rollout[[1, 3], :, outputs.index("z_500")]).any()
    assert not np.isnan(rollout[:, 100:500]).any()


def test_a_lightning_checkpoint_imports_the_same_model(imports, tmp_path) -> None:
    """last.ckpt holds no edge buffers: its edges rebuilt from graph_data give the inference checkpoint's model."""
    ours = load_inference_checkpoint(imports["default"])
    lightning = load_inference_checkpoint(imported("default", tmp_path, kind="last.ckpt"))
    assert ours.model.state_dict().keys() == lightning.model.state_dict().keys()
    for name, tensor in ours.model.state_dict().items():
        assert torch.equal(tensor, lightning.model.state_dict()[name]), name
    for edges in ("encoder", "processor", "decoder"):
        a, b = getattr(ours.model, edges).edges, getattr(lightning.model, edges).edges
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.fixed, b.fixed), edges


def test_the_import_records_where_it_came_from(imports) -> None:
    source = GOLDEN / "default" / "inference-last.ckpt"
    with zipfile.ZipFile(source) as archive:
        name = next(n for n in archive.namelist() if n.endswith("anemoi-metadata/anemoi.json"))
        metadata = json.loads(archive.read(name))
    provenance = load_inference_checkpoint(imports["default"]).provenance
    assert provenance["sha256"] == file_sha256(source)
    assert provenance["run_id"] == metadata["run_id"]
    assert (provenance["anemoi_models"], provenance["anemoi_training"]) == ("0.19.0", "0.17.1")
    assert provenance["kind"] == "inference"


def test_the_file_is_read_as_plain_weights(imports) -> None:
    """Our inference.pt of an anemoi model loads with torch.load(weights_only=True), like any of ours."""
    state = torch.load(imports["forcings"], weights_only=True)
    assert state["format"] == "anemo_like-inference-v1"

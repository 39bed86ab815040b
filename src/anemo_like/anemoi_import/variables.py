"""anemoi's variable order, normalisation, output floors and imputation, in our terms.

anemoi keeps the dataset's order (diagnostics left out of the input, forcings out of the output); we group
[prognostic, forcing, computed forcing] in and [prognostic, diagnostic] out. Forcings that earthkit-data computes
from the date and the grid become computed forcings here, so a forecast needs no dataset for them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, get_args

import numpy as np
import torch

from anemo_like.anemoi_import.archive import ImportRefused
from anemo_like.anemoi_import.content import AnemoiContent
from anemo_like.anemoi_import.spec import IMPUTERS, NORMALIZER, AnemoiSpec
from anemo_like.config.data_schema import ComputedForcing
from anemo_like.data.normalizer import Normalizer
from anemo_like.data.variables import VariableLayout, VariableRoles

COMPUTED = set(get_args(ComputedForcing))
RELU = "anemoi.models.layers.bounding.ReluBounding"


@dataclass(frozen=True)
class VariableMap:
    """Our variable roles and where each of our model's inputs and outputs sits in anemoi's."""

    roles: VariableRoles
    input_index: list[int]  # our input position -> anemoi's model input index
    output_index: list[int]  # our output position -> anemoi's model output index
    data_index: dict[str, int]  # name -> anemoi's data index (statistics, normaliser)
    input_affine: list[tuple[float, float]]  # per our input: (mul, add) anemoi normalises it with and we do not


def _indices(metadata: dict[str, Any], dataset: str) -> dict[str, Any]:
    return metadata["data_indices"][dataset]


def _names(section: dict[str, Any], role: str) -> list[str]:
    """The names of ``role`` (prognostic, forcing, diagnostic) of an index section, in its order."""
    by_index = {index: name for name, index in section["name_to_index"].items()}
    return [by_index[i] for i in section[role]]


def variable_map(metadata: dict[str, Any], spec: AnemoiSpec, content: AnemoiContent) -> VariableMap:
    """Roles and index maps from the checkpoint's ``data_indices``; refuses prognostic pairs that differ."""
    indices = _indices(metadata, spec.dataset)
    model_in, model_out, data_in = indices["model"]["input"], indices["model"]["output"], indices["data"]["input"]
    prognostic, forcings = _names(model_in, "prognostic"), _names(model_in, "forcing")
    if prognostic != _names(model_out, "prognostic"):
        raise ImportRefused(
            f"anemoi's prognostic inputs {prognostic} and outputs {_names(model_out, 'prognostic')} differ in order"
        )
    roles = VariableRoles(
        prognostic=prognostic,
        forcing=[name for name in forcings if name not in COMPUTED],
        diagnostic=_names(model_out, "diagnostic"),
        computed=[name for name in forcings if name in COMPUTED],
    )
    data_index = dict(data_in["name_to_index"])
    mul, add = _normaliser_buffers(content)
    affine = [(1.0, 0.0)] * (len(roles.prognostic) + len(roles.forcing))
    affine += [(float(mul[data_index[name]]), float(add[data_index[name]])) for name in roles.computed]
    return VariableMap(
        roles=roles,
        input_index=[model_in["name_to_index"][name] for name in roles.input],
        output_index=[model_out["name_to_index"][name] for name in roles.output],
        data_index=data_index,
        input_affine=affine,
    )


def _normaliser_buffers(content: AnemoiContent) -> tuple[torch.Tensor, torch.Tensor]:
    """anemoi's normaliser as stored: x_normalised = x * mul + add, (V_data,) float32 each."""
    names = [name for name in content.processors if name.endswith("._norm_mul")]
    if len(names) != 1:
        raise ImportRefused("the checkpoint holds no single InputNormalizer (_norm_mul / _norm_add buffers)")
    prefix = names[0].removesuffix("_norm_mul")
    return content.processors[prefix + "_norm_mul"], content.processors[prefix + "_norm_add"]


def normalizer(variables: VariableMap, content: AnemoiContent) -> Normalizer:
    """Our normaliser of the variables read from a dataset: offset -add/mul and scale 1/mul of anemoi's."""
    mul, add = (t.double().numpy() for t in _normaliser_buffers(content))
    index = [variables.data_index[name] for name in variables.roles.read]
    if not np.all(np.isfinite(mul[index]) & (mul[index] != 0)):
        raise ImportRefused("the checkpoint's normaliser has a zero or non-finite scale")
    return Normalizer(list(variables.roles.read), -add[index] / mul[index], 1.0 / mul[index])


def _floors(spec: AnemoiSpec, content: AnemoiContent, roles: VariableRoles) -> dict[int, float]:
    """Output position -> the normalised value it is floored at (ReLU: 0; normalised ReLU: its stored minimum)."""
    floors: dict[int, float] = {}
    for k, (target, names) in enumerate(spec.boundings):
        present = [name for name in names if name in roles.output]
        if target == RELU:
            values = [0.0] * len(present)
        else:
            values = content.tensors[f"boundings.{spec.dataset}.{k}.norm_min_val"].tolist()
        for name, value in zip(present, values, strict=True):
            position = roles.output.index(name)
            floors[position] = max(floors.get(position, -np.inf), float(value))
    return floors


def _replacements(target: str, config: dict[str, Any], statistics: dict[str, np.ndarray], index: dict[str, int]):
    """(name, value in physical units) of every variable an imputer fills, in the data order."""
    default = config.get("default", "none")
    methods = {
        name: str(method)
        for method, names in config.items()
        if method != "default" and names not in (None, "none") and not isinstance(names, str)
        for name in names
    }
    for name in sorted(index, key=index.get):
        method = methods.get(name, default)
        if method == "none":
            continue
        value = float(method) if target.endswith("ConstantImputer") else statistics[method][index[name]]
        yield name, float(value)


def _imputation(
    spec: AnemoiSpec, content: AnemoiContent, variables: VariableMap
) -> tuple[dict[int, float], dict[int, int]]:
    """Input position -> its normalised fill value; output position -> the input position whose NaN (in the first
    input state) it gets back. An imputer before the normaliser fills physical values, which are normalised as anemoi
    does (fp32 ``value * mul + add``)."""
    mul, add = _normaliser_buffers(content)
    roles, filled, restored = variables.roles, {}, {}
    normalised = False
    for _, target, config in spec.processors:
        if target == NORMALIZER:
            normalised = True
            continue
        assert target in IMPUTERS
        for name, value in _replacements(target, config, content.statistics, variables.data_index):
            if name not in roles.input or name in roles.computed or roles.input.index(name) in filled:
                continue
            fill = torch.tensor(value, dtype=torch.float32)
            if not normalised:
                i = variables.data_index[name]
                fill = fill * mul[i] + add[i]
            filled[roles.input.index(name)] = float(fill)
            if name in roles.output:
                restored[roles.output.index(name)] = roles.input.index(name)
    return filled, restored


def variable_layout(spec: AnemoiSpec, content: AnemoiContent, variables: VariableMap) -> VariableLayout:
    """The layout of our model: prognostic variables first on both sides, anemoi's floors and imputation."""
    roles = variables.roles
    filled, restored = _imputation(spec, content, variables)
    return VariableLayout(
        num_input=len(roles.input),
        num_output=len(roles.output),
        prognostic_input=list(range(len(roles.prognostic))),
        prognostic_output=list(range(len(roles.prognostic))),
        relu_floor=_floors(spec, content, roles),
        imputed=filled,
        restored=restored,
    )

"""anemoi-models' weights under our names: renamed, the variable columns and rows permuted to our order, the
trainable edge features in destination-sorted order (docs/anemoi.md has the table)."""

from __future__ import annotations

import re

import torch
from torch import Tensor

from anemo_like.anemoi_import.archive import ImportRefused
from anemo_like.anemoi_import.spec import AnemoiSpec
from anemo_like.anemoi_import.variables import VariableMap

BLOCK = {  # a graph-transformer block's modules: anemoi's name -> ours
    "lin_query": "lin_query",
    "lin_key": "lin_key",
    "lin_value": "lin_value",
    "lin_self": "lin_self",
    "lin_edge": "lin_edge",
    "projection": "projection",
    "layer_norm_attention": "norm_dst",
    "layer_norm_attention_src": "norm_src",
    "layer_norm_mlp_dst": "norm_mlp",
    "node_dst_mlp.mlp.0": "mlp.fc1",
    "node_dst_mlp.mlp.2": "mlp.fc2",
}
ALIAS = "layer_norm_attention_dest"  # the same tensors as layer_norm_attention, stored twice
LAYOUT_VERSION = "trainable_layout_version"  # 1: trainable edge features already destination-sorted
NOT_WEIGHTS = re.compile(r"(^boundings\.|\.(perm|edge_attr|edge_index_base|edge_inc|trainable_layout_version)$)")


def _renames(spec: AnemoiSpec) -> list[tuple[re.Pattern, str]]:
    data, hidden = re.escape(spec.dataset), re.escape(spec.hidden)
    block = "|".join(re.escape(name) for name in sorted(BLOCK, key=len, reverse=True))
    return [
        (re.compile(rf"node_attributes\.latlons_{data}$"), "data_features.position"),
        (re.compile(rf"node_attributes\.latlons_{hidden}$"), "hidden_features.position"),
        (re.compile(rf"node_attributes\.trainable_tensors\.{data}\.trainable$"), "data_features.trainable"),
        (re.compile(rf"node_attributes\.trainable_tensors\.{hidden}\.trainable$"), "hidden_features.trainable"),
        (re.compile(rf"encoder_graph_provider\.{data}\.trainable\.trainable$"), "encoder.edges.trainable"),
        (re.compile(r"processor_graph_provider\.trainable\.trainable$"), "processor.edges.trainable"),
        (re.compile(rf"decoder_graph_provider\.{data}\.trainable\.trainable$"), "decoder.edges.trainable"),
        (re.compile(r"encoder\.\w+\.emb_nodes_src\.(weight|bias)$"), r"encoder.embed_src.\1"),
        (re.compile(r"encoder\.\w+\.emb_nodes_dst\.(weight|bias)$"), r"encoder.embed_dst.\1"),
        (re.compile(r"decoder\.\w+\.emb_nodes_dst\.(weight|bias)$"), r"decoder.embed_dst.\1"),
        (re.compile(r"decoder\.\w+\.node_data_extractor\.([01])\.(weight|bias)$"), r"decoder.head.\1.\2"),
        (re.compile(rf"(encoder|decoder)\.\w+\.proc\.({block})\.(weight|bias)$"), r"\1.block.{\2}.\3"),
        (re.compile(rf"processor\.proc\.(\d+)\.({block})\.(weight|bias)$"), r"processor.layers.\1.block.{\2}.\3"),
    ]


def _our_name(name: str, renames: list[tuple[re.Pattern, str]]) -> str | None:
    for pattern, replacement in renames:
        match = pattern.match(name)
        if match:
            ours = match.expand(replacement)
            return re.sub(r"\{([\w.]+)\}", lambda m: BLOCK[m.group(1)], ours)
    return None


def _columns(weight: Tensor, bias: Tensor, variables: VariableMap, steps: int) -> tuple[Tensor, Tensor]:
    """A first linear layer over [steps x anemoi's inputs, node attributes] -> over [steps x ours, attributes]; an
    input anemoi normalised and we do not (a computed forcing) has its normalisation folded into the weights."""
    count = len(variables.input_index)
    order = [t * count + i for t in range(steps) for i in variables.input_index]
    order += list(range(steps * count, weight.shape[1]))
    weight = weight[:, order].double()
    bias = bias.double().clone()
    for t in range(steps):
        for j, (mul, add) in enumerate(variables.input_affine):
            if (mul, add) != (1.0, 0.0):
                bias += weight[:, t * count + j] * add
                weight[:, t * count + j] *= mul
    return weight.float(), bias.float()


def _rows(tensor: Tensor, variables: VariableMap, steps: int) -> Tensor:
    """The decoder head's rows over [steps x anemoi's outputs] -> over [steps x ours]."""
    count = len(variables.output_index)
    return tensor[[t * count + i for t in range(steps) for i in variables.output_index]]


def our_state_dict(
    tensors: dict[str, Tensor], spec: AnemoiSpec, variables: VariableMap, perms: dict[str, Tensor]
) -> dict[str, Tensor]:
    """Our model's parameters and position buffers from anemoi's ``tensors``; a tensor with no counterpart here is
    refused by name (an option the config check did not catch)."""
    renames, ours, unknown = _renames(spec), {}, []
    for name, tensor in tensors.items():
        if NOT_WEIGHTS.search(name):
            continue
        if ALIAS in name:
            twin = tensors.get(name.replace(ALIAS, "layer_norm_attention"))
            if twin is None or not torch.equal(twin, tensor):
                unknown.append(name)
            continue
        target = _our_name(name, renames)
        if target is None:
            unknown.append(name)
        else:  # a tensor of its own, not a view into a larger storage (which saving would write whole)
            whole = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
            ours[target] = tensor.detach() if whole else tensor.detach().clone()
    if unknown:
        raise ImportRefused(f"the checkpoint holds tensors with no counterpart in our model: {', '.join(unknown[:8])}")
    for part in ("encoder", "processor", "decoder"):
        key = f"{part}.edges.trainable"
        prefix = {"encoder": f"encoder_graph_provider.{spec.dataset}.", "processor": "processor_graph_provider.",
                  "decoder": f"decoder_graph_provider.{spec.dataset}."}[part]  # fmt: skip
        version = tensors.get(prefix + LAYOUT_VERSION)
        if key in ours and (version is None or int(version) < 1):  # anemoi-models < 0.16: in the raw edge order
            ours[key] = ours[key][perms[part]]
    steps, out_steps = spec.multistep_input, spec.multistep_output
    for layer in ("encoder.embed_src", "decoder.embed_dst"):
        ours[f"{layer}.weight"], ours[f"{layer}.bias"] = _columns(
            ours[f"{layer}.weight"], ours[f"{layer}.bias"], variables, steps
        )
    for name in ("decoder.head.1.weight", "decoder.head.1.bias"):
        ours[name] = _rows(ours[name], variables, out_steps)
    return ours

"""One value per default: the shipped YAML config groups, the schema's field defaults and the docs table agree.

The YAML lists every key (Hydra only overrides keys it has) and the schema keeps defaults (sections are built in
code without YAML), so both hold each default; these tests make a disagreement fail and name it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from pydantic import BaseModel, ValidationError

from anemo_like.config import RunConfig, config_dir

DOCS = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
GROUP_OPTIONS = sorted(f"{path.parent.name}/{path.stem}" for path in config_dir().glob("*/*.yaml"))
# Keys an option sets on purpose to something else than the schema's default: what that option chooses.
CHOICES = {
    "data/": ("variables.", "normalizer.per_variable", "splits."),  # a dataset's variables and date splits
    "model/transformer": ("processor.type",),  # the point of the option
}


def group_option(option: str) -> dict[str, Any]:
    """The mapping a config group option (``model/graphtransformer``) puts under its group, interpolations kept."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        cfg = compose(config_name=option)
    return OmegaConf.to_container(cfg, resolve=False)[option.split("/")[0]]


def section_model(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    annotation = model.model_fields[name].annotation
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def leaf_keys(model: type[BaseModel], values: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple]:
    """Dotted paths (as tuples) of the values set in ``values``, descending into schema sections only."""
    for name, value in values.items():
        nested = section_model(model, name)
        if nested is not None and isinstance(value, dict):
            yield from leaf_keys(nested, value, (*prefix, name))
        else:
            yield (*prefix, name)


def value_at(config: BaseModel, key: tuple[str, ...]) -> Any:
    for part in key:
        config = getattr(config, part)
    return config


def without(values: dict[str, Any], key: tuple[str, ...]) -> dict[str, Any]:
    trimmed = copy.deepcopy(values)
    parent = trimmed
    for part in key[:-1]:
        parent = parent[part]
    del parent[key[-1]]
    return trimmed


def is_choice(option: str, key: str) -> bool:
    return any(option.startswith(o) and key.startswith(keys) for o, keys in CHOICES.items())


def disagreements(option: str) -> list[str]:
    """Keys of ``option`` whose YAML value differs from the one the schema picks when the key is left out.

    Leaving the key out (rather than reading the field's default) lets the schema's rules across keys apply, e.g.
    ``processor.num_chunks`` defaults to at most ``num_layers``; validating both sides compares values as the run
    sees them (``precision: 32`` is ``"32"``). Keys the schema requires (no default) are skipped.
    """
    group = option.split("/")[0]
    schema = RunConfig.model_fields[group].annotation
    values = group_option(option)
    as_set = schema.model_validate(values)
    found = []
    for key in leaf_keys(schema, values):
        dotted = ".".join(key)
        try:
            as_default = schema.model_validate(without(values, key))
        except ValidationError as error:
            if {e["type"] for e in error.errors()} == {"missing"}:
                continue  # required: the YAML is the only source
            raise
        yaml_value, schema_value = value_at(as_set, key), value_at(as_default, key)
        if yaml_value != schema_value and not is_choice(option, dotted):
            found.append(f"{option}.yaml {group}.{dotted}: YAML {yaml_value!r}, schema default {schema_value!r}")
    return found


@pytest.mark.parametrize("option", GROUP_OPTIONS)
def test_yaml_group_values_are_the_schema_defaults(option: str) -> None:
    found = disagreements(option)
    assert not found, "YAML and schema defaults disagree (change one to the other):\n" + "\n".join(found)


def test_every_group_option_is_checked() -> None:
    assert {option.split("/")[0] for option in GROUP_OPTIONS} == set(RunConfig.model_fields)


def test_choices_name_keys_that_exist() -> None:
    for prefix, names in CHOICES.items():
        options = [o for o in GROUP_OPTIONS if o.startswith(prefix)]
        assert options, f"CHOICES names {prefix}, which is no config group option"
        for name in names:
            assert any(
                ".".join(k).startswith(name)
                for o in options
                for k in leaf_keys(RunConfig.model_fields[o.split("/")[0]].annotation, group_option(o))
            ), f"CHOICES names {prefix} {name}, which no such option sets"


TOP_CONFIGS = sorted(path.stem for path in config_dir().glob("*.yaml"))
NOT_LISTED = {
    "model.processor.window_size",  # the transformer processor's keys: model/transformer.yaml lists them
    "model.processor.attention_implementation",
    "data.builtin_seed",  # the built-in dataset's: data/builtin.yaml lists it, another dataset has none
}


def unlisted(model: type[BaseModel], values: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[str]:
    """Dotted schema keys that ``values`` (a composed config) lacks, descending into the sections it holds."""
    for name in model.model_fields:
        nested = section_model(model, name)
        if name not in values:
            yield ".".join((*prefix, name))
        elif nested is not None and isinstance(values[name], dict):
            yield from unlisted(nested, values[name], (*prefix, name))


@pytest.mark.parametrize("name", TOP_CONFIGS)
def test_every_schema_key_is_in_the_shipped_configs(name: str) -> None:
    """Hydra overrides only keys the composed config has: a key left out of the YAML needs a '+' to be set."""
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        values = OmegaConf.to_container(compose(config_name=name), resolve=False)
    missing = sorted(set(unlisted(RunConfig, values)) - NOT_LISTED)
    assert not missing, f"{name}.yaml composes without {missing}: add them to their group's YAML"


def field_at(key: str):
    model: type[BaseModel] = RunConfig
    *sections, name = key.split(".")
    for section in sections:
        model = section_model(model, section)
    return model.model_fields[name]


def documented_defaults() -> Iterator[tuple[str, str]]:
    """(key, default cell) of every row of the docs tables; "`a.b` / `.c` | 1 / 2" rows give one pair per key."""
    for row in re.findall(r"^\| (`.+?) \| (.+?) \| .* \|$", DOCS.read_text(), flags=re.MULTILINE):
        cell, default = row
        keys = re.findall(r"`([a-z_.]+)`", cell)
        keys = [keys[0], *(keys[0].rsplit(".", 1)[0] + k if k.startswith(".") else k for k in keys[1:])]
        defaults = default.split(" / ")
        defaults = defaults if len(defaults) > 1 else defaults * len(keys)  # "| `a.start` / `.end` | null |"
        yield from zip(keys, defaults, strict=True)


def parse_documented(text: str) -> Any:
    """'`edges` (`heads` for ...)' -> 'edges'; '1e-3' -> 0.001; 'null' -> None; '[0.9, 0.95]' -> [0.9, 0.95]."""
    text = re.sub(r"\s*\(.*\)$", "", text.strip()).strip("`")
    try:
        return float(text) if re.fullmatch(r"[-+]?\d+(\.\d*)?e[-+]?\d+", text) else yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def test_documented_defaults_are_the_schema_defaults() -> None:
    wrong = []
    checked = 0
    for key, text in documented_defaults():
        try:
            field = field_at(key)
        except (KeyError, AttributeError):
            continue  # a list entry's key (model.compile.module): no default of its own
        if field.is_required():
            continue  # the docs show what the YAML sets
        default = field.get_default(call_default_factory=True)
        default = list(default) if isinstance(default, tuple) else default
        documented = parse_documented(text)
        checked += 1
        if documented != default and str(documented) != str(default):
            wrong.append(f"{key}: docs/configuration.md says {text}, the schema {default!r}")
    assert checked > 100, f"only {checked} documented defaults were read: has the table format changed?"
    assert not wrong, "\n".join(wrong)

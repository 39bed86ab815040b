"""Turn a composed Hydra config into a validated schema (:class:`RunConfig`, or another command's), with errors a
person can act on."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar, get_args, get_origin

from pydantic import BaseModel, ValidationError

from anemo_like.config.schema import RunConfig
from anemo_like.config.wording import expected

Schema = TypeVar("Schema", bound=BaseModel)


class ConfigError(ValueError):
    """The configuration is invalid; the message names each offending key, its value and what is allowed."""


def _sections(annotation: Any) -> list[type[BaseModel]]:
    """The config sections a field may hold: its model, a union's (``NoiseConfig | None``, a discriminated union
    of sections) or a list's items; not a mapping's values (:func:`_entry_sections`: they sit under free keys)."""
    if get_origin(annotation) is dict:
        return []
    candidates = [annotation, *get_args(annotation)]
    return [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]


def _entry_sections(annotation: Any) -> list[type[BaseModel]]:
    """The sections of a mapping's values (``grib.variables.NAME``), under keys the user names."""
    return _sections(get_args(annotation)[1]) if get_origin(annotation) is dict and get_args(annotation) else []


def _section(annotation: Any) -> type[BaseModel] | None:
    """The first of :func:`_sections`, or None."""
    return next(iter(_sections(annotation)), None)


def _members_tagged(sections: list[type[BaseModel]], discriminator: str | None, tag: object) -> list[type[BaseModel]]:
    """The member of a discriminated union of ``sections`` whose ``discriminator`` literal is ``tag`` ([] if none)."""
    if discriminator is None:
        return []
    return [s for s in sections if get_args(s.model_fields[discriminator].annotation) == (tag,)]


def _allowed_keys(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """:func:`_keys_at` as a list ([] where any name goes)."""
    return _keys_at(model, path) or []


def _keys_at(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str] | None:
    """Field names allowed at ``path`` (the parent of the offending key), walking the schema (None: any name, an
    entry of a mapping of sections such as ``grib.variables``); an index of a list of
    sections (``model.compile.0``) stays on its item; a union of sections allows the keys of all its members, or of
    the one whose tag follows in ``path`` (pydantic's loc of a discriminated union: ``graph.hidden.stretched``)."""
    current: list[type[BaseModel]] = [model]
    discriminator, entries = None, None
    for part in path:
        if isinstance(part, int):
            continue
        if entries is not None:  # the key of a mapping's entry: any name, its value a section
            current, entries = entries, None
            continue
        member = _members_tagged(current, discriminator, part)
        discriminator = None
        if member:
            current = member
            continue
        fields = [section.model_fields[part] for section in current if part in section.model_fields]
        discriminator = next((field.discriminator for field in fields if field.discriminator), None)
        current = [section for field in fields for section in _sections(field.annotation)]
        entries = [section for field in fields for section in _entry_sections(field.annotation)] or None
        if not current and entries is None:
            return []
    if entries is not None:  # the mapping itself: any entry name, sections below it
        return None
    return list(dict.fromkeys(key for section in current for key in section.model_fields))


def _without_union_tags(schema: type[BaseModel], loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """``loc`` without the member tags pydantic puts after a discriminated union of sections
    (``graph.hidden.stretched.margin_km``: ``graph.hidden.margin_km``)."""
    kept: list[str | int] = []
    sections: list[type[BaseModel]] = [schema]
    discriminator = None
    for part in loc:
        tagged = _members_tagged(sections, discriminator, part)
        discriminator = None
        if tagged:
            sections = tagged
            continue
        kept.append(part)
        if isinstance(part, int):
            continue
        fields = [section.model_fields[part] for section in sections if part in section.model_fields]
        discriminator = next((field.discriminator for field in fields if field.discriminator), None)
        sections = [section for field in fields for section in _sections(field.annotation)]
    return tuple(kept)


def _schema_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every dotted key of ``model``: its sections and their keys (not inside lists or mappings)."""
    keys = []
    for name, field in model.model_fields.items():
        keys.append((*prefix, name))
        section = None if get_origin(field.annotation) in (list, dict, tuple) else _section(field.annotation)
        if section is not None:
            keys += _schema_keys(section, (*prefix, name))
    return keys


def _suggestions(schema: type[BaseModel], path: tuple[str, ...], depth: int, allowed: list[str]) -> list[str]:
    """Keys ``path`` may have meant, ``path[depth]`` being unknown: the same key in another section (``model.lr``:
    ``training.optimizer.lr``), else a close name in this section, else a close key in another section."""
    rest = ".".join(path[depth:])
    elsewhere: dict[str, list[str]] = {}
    for key in _schema_keys(schema):
        if len(key) >= len(path) - depth:
            elsewhere.setdefault(".".join(key[depth - len(path) :]), []).append(".".join(key))
    if rest in elsewhere:
        return elsewhere[rest]
    close = difflib.get_close_matches(path[depth], allowed, n=1)
    if close:
        return [".".join([*path[:depth], close[0]])]
    close = difflib.get_close_matches(rest, elsewhere, n=1)
    return elsewhere[close[0]] if close else []


def _value_at(config: Mapping[str, Any], path: tuple[str | int, ...]) -> Any:
    value: Any = config
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _held(loc: tuple[str | int, ...], config: Mapping[str, Any]) -> tuple[str | int, ...]:
    """The part of ``loc`` the config holds: pydantic ends the loc of a union member's error with the member's name
    (``model.encoder.num_chunks.int``, ``...num_chunks.literal['auto']``)."""
    value: Any = config
    for depth, part in enumerate(loc):
        in_list = isinstance(value, list) and isinstance(part, int) and part < len(value)
        if not (in_list or (isinstance(value, Mapping) and part in value)):
            return loc[:depth]
        value = value[part]
    return loc


def _merge_union_members(errors: list[Any], config: Mapping[str, Any]) -> list[Any]:
    """pydantic's errors with those of one value's union members (an error each) merged into one error of its key:
    ``expected a whole number, or 'auto'``."""
    merged: list[Any] = []
    keys: dict[tuple[str | int, ...], dict[str, Any]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        held = loc if error["type"] in ("missing", "extra_forbidden") else _held(loc, config)
        if held == loc or not held:
            merged.append(error)
        elif held in keys:
            keys[held]["msg"] += ", or " + error["msg"].removeprefix("expected ")
        else:
            keys[held] = {**error, "loc": held}
            merged.append(keys[held])
    return merged


def _unknown_key(schema: type[BaseModel], path: tuple[str | int, ...], depth: int, allowed: list[str]) -> str:
    """The message for key ``path`` whose part ``path[depth]`` is not among ``allowed``, with suggestions."""
    guesses = [f"'{key}'" for key in _suggestions(schema, tuple(map(str, path)), depth, allowed)]
    choices = " or ".join([", ".join(guesses[:-1]), guesses[-1]] if len(guesses) > 1 else guesses)
    hint = f" (did you mean {choices}?)" if guesses else ""
    return f"unknown config key '{'.'.join(map(str, path))}'{hint}; allowed here: {', '.join(allowed)}"


def _describe(error: dict[str, Any], config: Mapping[str, Any], schema: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    if error["type"] == "extra_forbidden":
        return _unknown_key(schema, loc, len(loc) - 1, _allowed_keys(schema, tuple(error["tagged_loc"])[:-1]))
    value = _value_at(config, loc)
    message = error["msg"]
    if not loc:  # a rule across sections: its message names the keys
        return message
    section = _allowed_keys(schema, loc)
    if isinstance(value, Mapping) and section:  # a rule across several keys of a section: name the section only
        return f"config section '{key}': {message}"
    if error["type"] == "missing":
        return _missing(key)
    if error["type"] == "model_type" and section:  # pydantic names the section's class: name its keys instead
        example = "" if any(isinstance(part, int) for part in loc) else f", e.g. {key}.{section[0]}=..."
        message = f"expected a section of keys {', '.join(section)}{example}"
    return f"config key '{key}' = {value!r}: {message}"


def _unset_keys(config: Any, prefix: str = "") -> list[str]:
    """Dotted keys whose value is Hydra's mandatory marker ``???`` (left for the user to set)."""
    if isinstance(config, Mapping):
        return [key for name, value in config.items() for key in _unset_keys(value, f"{prefix}{name}.")]
    return [prefix.removesuffix(".")] if config == "???" else []


def _missing(key: str) -> str:
    return f"missing config key '{key}': set it in the config or on the command line ({key}=...)"


def validate_schema(schema: type[Schema], config: Mapping[str, Any]) -> Schema:
    """Validate a resolved config mapping against ``schema``; raise :class:`ConfigError` listing every problem."""
    unset = _unset_keys(config)
    if unset:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(map(_missing, unset)))
    try:
        return schema.model_validate(config)
    except ValidationError as exc:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(config_problems(exc, config, schema))) from None


def config_problems(error: ValidationError, config: Mapping[str, Any], schema: type[BaseModel]) -> list[str]:
    """One line per problem of ``error`` (``schema`` validating ``config``), naming the key, value and what is
    allowed."""
    errors = [
        {
            **problem,
            "msg": expected(problem),
            "loc": _without_union_tags(schema, tuple(problem["loc"])),
            "tagged_loc": problem["loc"],
        }
        for problem in error.errors()
    ]
    return [_describe(problem, config, schema) for problem in _merge_union_members(errors, config)]


def validate_config(config: Mapping[str, Any]) -> RunConfig:
    """The training config: :func:`validate_schema` with :class:`RunConfig`."""
    return validate_schema(RunConfig, config)


def check_schema_keys(schema: type[BaseModel], arguments: list[str]) -> None:
    """Reject command-line overrides ``key=value`` whose key ``schema`` does not know, with a suggestion.

    Hydra's own flags, ``hydra.*`` keys, config-group choices (``model=transformer``) and explicit additions or
    deletions (``+key=...``, ``~key``) are left to Hydra.
    """
    problems = []
    for argument in arguments:
        if argument.startswith("~") and _is_section(schema, tuple(argument[1:].partition("=")[0].split("."))):
            key = argument[1:].partition("=")[0]
            problems.append(
                f"cannot delete {key} ({argument}): it is a whole section, and the run would go on with every default "
                f"of it; delete or set keys inside it instead (~{key}.KEY, {key}.KEY=VALUE)"
            )
            continue
        if argument.startswith(("-", "+", "~")) or "=" not in argument:
            continue
        path = tuple(argument.split("=", 1)[0].split("."))
        if path[0] == "hydra" or (len(path) == 1 and path[0] in schema.model_fields):
            continue
        for depth in range(len(path)):
            allowed = _keys_at(schema, path[:depth])
            if allowed is None:  # an entry of a mapping of sections (grib.variables.NAME): any name
                continue
            if not allowed:  # free-form mapping (e.g. per-variable weights): anything goes below here
                break
            if path[depth] not in allowed:
                problems.append(_unknown_key(schema, path, depth, allowed))
                break
    if problems:  # a key given twice is one problem
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(dict.fromkeys(problems)))


def _is_section(schema: type[BaseModel], path: tuple[str, ...]) -> bool:
    """Whether ``path`` names a section (a nested model) of ``schema``, not a single value."""
    parent = _keys_at(schema, path[:-1]) or []
    if path[-1] not in parent:
        return False
    sections: list[type[BaseModel]] = [schema]
    for part in path[:-1]:
        fields = [s.model_fields[part] for s in sections if part in s.model_fields]
        sections = [section for field in fields for section in _sections(field.annotation)]
    fields = [s.model_fields[path[-1]] for s in sections if path[-1] in s.model_fields]
    return any(_sections(field.annotation) for field in fields)


def check_override_keys(arguments: list[str]) -> None:
    """The training command's overrides: :func:`check_schema_keys` with :class:`RunConfig`."""
    check_schema_keys(RunConfig, arguments)

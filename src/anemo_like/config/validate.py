"""Turn a composed Hydra config into a validated schema (:class:`RunConfig`, or another command's), with errors a
person can act on."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from anemo_like.config.schema import RunConfig

Schema = TypeVar("Schema", bound=BaseModel)


class ConfigError(ValueError):
    """The configuration is invalid; the message names each offending key, its value and what is allowed."""


def _allowed_keys(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Field names allowed at ``path`` (the parent of the offending key), walking the schema."""
    current: Any = model
    for part in path:
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        current = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if current is None:
            return []
    return list(current.model_fields)


def _value_at(config: Mapping[str, Any], path: tuple[str | int, ...]) -> Any:
    value: Any = config
    for part in path:
        try:
            value = value[part]
        except (KeyError, IndexError, TypeError):
            return None
    return value


def _unknown_key(path: tuple[str | int, ...], depth: int, allowed: list[str]) -> str:
    """The message for key ``path`` whose part ``path[depth]`` is not among ``allowed``, with a suggestion."""
    guess = difflib.get_close_matches(str(path[depth]), allowed, n=1)
    hint = f" (did you mean '{'.'.join([*map(str, path[:depth]), guess[0]])}'?)" if guess else ""
    return f"unknown config key '{'.'.join(map(str, path))}'{hint}; allowed here: {', '.join(allowed)}"


def _describe(error: dict[str, Any], config: Mapping[str, Any], schema: type[BaseModel]) -> str:
    loc = tuple(error["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    if error["type"] == "extra_forbidden":
        return _unknown_key(loc, len(loc) - 1, _allowed_keys(schema, loc[:-1]))
    value = _value_at(config, loc)
    message = error["msg"].removeprefix("Value error, ")
    if not loc:  # a rule across sections: its message names the keys
        return message
    if isinstance(value, Mapping):  # a rule across several keys of a section: name the section only
        return f"config section '{key}': {message}"
    if error["type"] == "missing":
        return _missing(key)
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
    return [_describe(problem, config, schema) for problem in error.errors()]


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
        if argument.startswith(("-", "+", "~")) or "=" not in argument:
            continue
        path = tuple(argument.split("=", 1)[0].split("."))
        if path[0] == "hydra" or (len(path) == 1 and path[0] in schema.model_fields):
            continue
        for depth in range(len(path)):
            allowed = _allowed_keys(schema, path[:depth])
            if not allowed:  # free-form mapping (e.g. per-variable weights): anything goes below here
                break
            if path[depth] not in allowed:
                problems.append(_unknown_key(path, depth, allowed))
                break
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def check_override_keys(arguments: list[str]) -> None:
    """The training command's overrides: :func:`check_schema_keys` with :class:`RunConfig`."""
    check_schema_keys(RunConfig, arguments)

"""The command line's Hydra overrides, checked before Hydra composes, and Hydra's own composition errors: each
problem is one line naming the argument and what to do, where Hydra prints several lines or a traceback.

Checked first (:func:`check_overrides`): an override that does not parse (a value the shell split at its spaces, a
character Hydra's grammar wants quoted), a sweep (a comma) without ``--multirun``, a config group given something
other than its options (``model=3``, ``model=nonexistent``), ``+NAME=...`` of a group no config directory holds,
and a ``--config-name`` none holds. Found while composing (:func:`composition_error`): ``+key=`` of a key already
set, ``key=`` of a key the composed config lacks (under a section that is null), ``~key`` of a missing key.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra._internal.utils import get_args_parser
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.errors import HydraException, MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from anemo_like.config import ConfigError

# Hydra's composition errors: the key each names, and what the user can do
_COMPOSITION = (
    (
        re.compile(r"Could not append to config\. An item is already at '(.+?)'"),
        "cannot add {key} ({argument}): it is already set; drop the +: {bare}",
    ),
    (
        re.compile(r"Could not override '(.+?)'"),
        "cannot set {key} ({argument}): the composed config holds no such key (its section is null or lacks it); "
        "add it with +{bare}",
    ),
    (
        re.compile(r"Could not delete from config\. '(.+?)' does not exist"),
        "cannot delete {key} ({argument}): the composed config holds no such key",
    ),
)


def config_groups(directories: Sequence[Path]) -> dict[str, list[str]]:
    """Config group -> its options, from the ``.yaml`` files in subfolders of ``directories``: ``a/b/c.yaml`` is
    option ``c`` of group ``a/b`` and option ``b/c`` of group ``a``."""
    groups: dict[str, set[str]] = {}
    for directory in directories:
        for file in Path(directory).rglob("*.yaml"):
            parts = file.relative_to(directory).with_suffix("").parts
            for split in range(1, len(parts)):
                groups.setdefault("/".join(parts[:split]), set()).add("/".join(parts[split:]))
    return {group: sorted(options) for group, options in groups.items()}


def check_overrides(argv: list[str], directories: Sequence[Path]) -> None:
    """Raise a :class:`ConfigError` with a line per override of ``argv`` Hydra would refuse before composing
    (``directories``: the config tree first, then any ``--config-dir``)."""
    arguments, _ = get_args_parser().parse_known_args(argv)
    groups = config_groups(directories)
    problems = [] if arguments.config_name is None else _primary_config(arguments.config_name, directories)
    parser = OverridesParser.create()
    previous = None
    for argument in arguments.overrides:
        try:
            override = parser.parse_override(argument)
        except HydraException as error:
            problems.append(_unparsed(argument, previous, error))
        else:
            problems += _problems(override, argument, groups, multirun=arguments.multirun)
        previous = argument
    if problems:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(problems))


def _primary_config(name: str, directories: Sequence[Path]) -> list[str]:
    """``--config-name NAME``: NAME.yaml must be in one of ``directories``."""
    if any((Path(d) / f"{name.removesuffix('.yaml')}.yaml").is_file() for d in directories):
        return []
    names = sorted({f.stem for d in directories for f in Path(d).glob("*.yaml")})
    return [f"--config-name '{name}': no such config; choose one of {', '.join(names)}"]


def _unparsed(argument: str, previous: str | None, error: HydraException) -> str:
    """The line of an override Hydra's grammar refuses, with how to quote it."""
    key, equals, value = argument.partition("=")
    if not equals and not argument.startswith("~"):
        example = "'key=\"a b\"'"
        if previous is not None and "=" in previous:
            before, _, start = previous.partition("=")
            example = f"'{before}=\"{start} {argument}\"'"
        return (
            f"cannot parse the override '{argument}': it is not key=value; a value with spaces must be quoted as "
            f"one argument, e.g. {example}"
        )
    example = f"'{key}=\"{value}\"'" if equals else "'key=\"a b\"'"
    start = getattr(error.__cause__, "startIndex", None)
    if start is not None and start < len(argument):  # the lexer stopped at a character it does not allow
        return (
            f"cannot parse the override '{argument}': the character {argument[start]!r} must be quoted, e.g. {example}"
        )
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return (
        f"cannot parse the override '{argument}' ({reason}): a value with spaces or special characters must be "
        f"quoted, e.g. {example}"
    )


def _problems(override: Override, argument: str, groups: dict[str, list[str]], *, multirun: bool) -> list[str]:
    """The lines of a parsed override: a sweep without ``--multirun``, a group choice that is not an option."""
    key, value_text = override.key_or_group, argument.partition("=")[2]
    if override.is_sweep_override() and not multirun:
        return [
            f"config key '{key}' = '{value_text}': a comma makes a sweep, which needs --multirun; write a list in "
            f"brackets, {key}=[{value_text}], or quote text, '{key}=\"{value_text}\"'"
        ]
    if override.type == OverrideType.DEL or key.split("/")[0] == "hydra":
        return []
    if key not in groups:
        if override.type != OverrideType.ADD or "." in key or not groups:  # adds a key: the schema checks it
            return []
        return [
            f"config group '{key}' does not exist ({argument}): the groups are {', '.join(sorted(groups))}; put "
            f"{key}/{value_text}.yaml in a folder and pass it with --config-dir"
        ]
    value, options = override.value(), groups[key]
    chosen = value if isinstance(value, list) and all(isinstance(v, str) for v in value) else [value]
    missing = [v if isinstance(v, str) else value_text for v in chosen if v not in options]
    if not missing:
        return []
    names = ", ".join(f"'{m}'" for m in missing)
    return [f"config group '{key}' has no option {names}: choose one of {', '.join(options)}, e.g. {key}={options[0]}"]


def composition_error(error: HydraException, argv: Sequence[str]) -> str:
    """The line of an error Hydra raised while composing the config, naming the override it came from."""
    message = str(error)
    for pattern, template in _COMPOSITION:
        found = pattern.search(message)
        if found:
            key = found.group(1)
            argument = next((a for a in argv if a.lstrip("+~").partition("=")[0] == key), key)
            return template.format(key=key, argument=argument, bare=argument.lstrip("+~"))
    first = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    options = getattr(error, "options", None) if isinstance(error, MissingConfigException) else None
    return f"Hydra cannot compose the config: {first}" + (f" (options: {', '.join(options)})" if options else "")


def interpolation_error(error: OmegaConfBaseException, cfg: DictConfig) -> str:
    """The line of an interpolation (``${...}``) the config cannot resolve: the key, its text and why."""
    key = getattr(error, "full_key", None) or ""
    raw: Any = OmegaConf.to_container(cfg, resolve=False)
    for part in key.split("."):
        raw = raw.get(part) if isinstance(raw, dict) else None
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return f"config key '{key}' = {raw!r}: {reason}; give a value, or ${{section.key}} naming a key that exists"

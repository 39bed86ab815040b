"""YAML syntax errors of config files as one :class:`ConfigError` line: ``FILE:LINE: what is wrong``.

Hydra reads config files with OmegaConf's loader (PyYAML's pure-Python ``SafeLoader`` that also refuses duplicate
keys) and prints a PyYAML traceback for a broken file. :func:`check_yaml_files` parses the ``.yaml`` files of the
config directories the same way before Hydra composes; :func:`yaml_config_error` words an error caught elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from anemo_like.config.validate import ConfigError

_DIR_OPTIONS = ("--config-dir", "-cd", "--config-path", "-cp")  # Hydra's options naming config directories
_UNCLOSED = {
    "while parsing a flow sequence": "the '[' opened here is not closed",
    "while parsing a flow mapping": "the '{' opened here is not closed",
    "while scanning a quoted scalar": "the quoted string opened here is not closed",
}


def _line_of(error: yaml.MarkedYAMLError) -> tuple[str, int]:
    """The file and 1-based line an error points at: the opening of an unclosed bracket or quote, else the
    problem itself."""
    mark = error.context_mark if error.context in _UNCLOSED and error.context_mark else error.problem_mark
    mark = mark or error.context_mark
    return (mark.name, mark.line + 1) if mark else ("<unknown>", 0)


def _line_text(mark: yaml.Mark) -> str:
    """The text of the marked line: from the parsed text, or re-read from the file an error names."""
    if mark.buffer is not None:
        return mark.buffer.splitlines()[mark.line] if mark.line < mark.buffer.count("\n") + 1 else ""
    try:
        lines = Path(mark.name).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return ""
    return lines[mark.line] if mark.line < len(lines) else ""


def _describe(error: yaml.MarkedYAMLError) -> str:
    """What is wrong, in words a config author can act on."""
    problem = str(error.problem or "").replace("'<stream end>'", "the end of the file")
    problem = problem.replace("end of stream", "end of the file")
    mark = error.problem_mark
    text = _line_text(mark) if mark else ""
    if mark and text[mark.column : mark.column + 1] == "\t":
        if text[: mark.column].strip(" \t") == "":
            return "YAML syntax error: found a tab character where indentation is expected (indent with spaces)"
        return "YAML syntax error: found a tab character where YAML allows only spaces"
    if error.context in _UNCLOSED and error.context_mark:
        return f"YAML syntax error: {_UNCLOSED[error.context]} ({problem} at line {mark.line + 1})"
    if problem == "mapping values are not allowed here":
        return (
            f"YAML syntax error: {problem} (check the indentation of this line and the one above, or quote a value "
            "that holds ': ')"
        )
    context = f" ({error.context} at line {error.context_mark.line + 1})" if error.context_mark else ""
    return f"YAML syntax error: {problem}{context}"


def yaml_config_error(error: yaml.YAMLError, file: str | Path | None = None) -> ConfigError:
    """The one-line :class:`ConfigError` (``FILE:LINE: ...``) of a YAML error raised while reading ``file``
    (default: the file named in the error's marks)."""
    if isinstance(error, yaml.MarkedYAMLError):
        name, line = _line_of(error)
        if str(error.problem).startswith("found duplicate key") and Path(file or name).is_file():
            return yaml_file_error(Path(file or name)) or ConfigError(f"{file or name}:{line}: {error.problem}")
        return ConfigError(f"{file or name}:{line}: {_describe(error)}")
    first = str(error).strip().splitlines()
    return ConfigError(f"{file or '<unknown>'}: YAML syntax error: {first[0] if first else type(error).__name__}")


def _duplicate_key(node: yaml.Node | None, file: str) -> ConfigError | None:
    """The first (in file order) key repeated within one mapping, as OmegaConf refuses it."""
    found: list[tuple[int, str]] = []
    stack = [node] if node is not None else []
    while stack:
        current = stack.pop()
        if isinstance(current, yaml.MappingNode):
            first: dict[str, int] = {}
            for key, value in current.value:
                if key.tag == yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    line = key.start_mark.line + 1
                    if key.value in first:
                        where = f"{file}:{line}: duplicate key '{key.value}'"
                        found.append((line, f"{where} (first at line {first[key.value]})"))
                    else:
                        first[key.value] = line
                stack.append(value)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend(current.value)
    return ConfigError(min(found)[1]) if found else None


def yaml_file_error(file: Path) -> ConfigError | None:
    """The :class:`ConfigError` of a YAML file Hydra would refuse (syntax error, duplicate key), None if it is fine."""
    try:
        node = yaml.compose(file.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)  # as OmegaConf parses
    except yaml.YAMLError as error:
        return yaml_config_error(error, file)
    except UnicodeDecodeError as error:
        return ConfigError(f"{file}: not UTF-8 text ({error.reason} at byte {error.start})")
    return _duplicate_key(node, str(file))


def check_yaml_files(directories: Iterable[Path]) -> None:
    """Raise the :class:`ConfigError` of the first broken ``.yaml`` file (Hydra reads no other) in ``directories``
    and their subfolders."""
    for directory in directories:
        for file in sorted(Path(directory).rglob("*.yaml")):
            error = yaml_file_error(file)
            if error is not None:
                raise error


def config_dirs(argv: Sequence[str], tree: Path) -> list[Path]:
    """``tree`` and the existing directories named by ``--config-dir``/``-cd`` and ``--config-path``/``-cp``
    (``--opt DIR`` or ``--opt=DIR``) on a Hydra command line."""
    found = [Path(tree)]
    for i, argument in enumerate(argv):
        option, equals, value = argument.partition("=")
        if option not in _DIR_OPTIONS:
            continue
        value = value if equals else (argv[i + 1] if i + 1 < len(argv) else "")
        if value and Path(value).expanduser().is_dir():
            found.append(Path(value).expanduser().resolve())
    return found

"""Write docs/reference/configuration.md from the pydantic config schema (src/anemo_like/config/schema.py).

python docs/gen_config_reference.py           # regenerate after changing the schema
python docs/gen_config_reference.py --check   # exit 1 if the committed page is out of date (tests run this)
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from anemo_like.config.schema import RunConfig

OUTPUT = Path(__file__).resolve().parent / "reference" / "configuration.md"
HEADER = """# Configuration reference

Generated from `src/anemo_like/config/schema.py` by `docs/gen_config_reference.py`: do not edit by hand; after
changing the schema run `python docs/gen_config_reference.py` (a test fails while this page is out of date).
[Configuration](../configuration.md) explains the config groups, the packaged configs and the overrides.

Defaults are the schema's; the packaged YAML configs (`training/config/`) set the keys marked *required* and
override some defaults. Every section rejects unknown keys.
"""
CONSTRAINTS = {
    annotated_types.Ge: ("ge", "≥ {}"),
    annotated_types.Gt: ("gt", "> {}"),
    annotated_types.Le: ("le", "≤ {}"),
    annotated_types.Lt: ("lt", "< {}"),
    annotated_types.MinLen: ("min_length", "length ≥ {}"),
}


def type_name(annotation: object) -> str:
    """`int | Literal['auto']` -> 'int or "auto"' (no `|`: it would split a Markdown table cell)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " or ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(type_name(arg) for arg in args)
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_name(arg) for arg in args)}]"
    return getattr(annotation, "__name__", str(annotation))


def constraints(field: FieldInfo) -> list[str]:
    return [
        text.format(getattr(item, attribute))
        for item in field.metadata
        for kind, (attribute, text) in CONSTRAINTS.items()
        if isinstance(item, kind)
    ]


def default(field: FieldInfo) -> str:
    if field.is_required():
        return "*required*"
    value = field.get_default(call_default_factory=True)
    return f"`{value if isinstance(value, str) else json.dumps(value)}`"


def cell(text: str) -> str:
    return text.replace("<", "&lt;").replace("|", "\\|").replace("*", "\\*")


def is_section(annotation: object) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def walk(model: type[BaseModel], prefix: str) -> Iterator[tuple[str, type[BaseModel] | FieldInfo]]:
    """(dotted key, nested model or leaf field), depth first in declaration order."""
    for name, field in model.model_fields.items():
        key = f"{prefix}.{name}"
        if is_section(field.annotation):
            yield key, field.annotation
            yield from walk(field.annotation, key)
        else:
            yield key, field


def section(name: str, model: type[BaseModel]) -> list[str]:
    keys_of_doc: dict[str, list[str]] = {}  # docstring of a nested model -> the keys holding that model
    rows = []
    for key, item in [(name, model), *walk(model, name)]:
        if isinstance(item, FieldInfo):
            kind = ", ".join([type_name(item.annotation), *constraints(item)])
            rows.append(f"| `{key}` | {cell(kind)} | {default(item)} | {cell(item.description or '')} |")
        elif item.__doc__:
            keys_of_doc.setdefault(inspect.cleandoc(item.__doc__), []).append(f"`{key}`")
    notes = [f"- {', '.join(keys)}: {doc}" for doc, keys in keys_of_doc.items()]
    table = ["| key | type | default | description |", "|---|---|---|---|", *rows, ""]
    return [f"## {name}", "", *notes, *([""] if notes else []), *table]


def render() -> str:
    lines = [HEADER]
    for name, field in RunConfig.model_fields.items():
        lines += section(name, field.annotation)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the page differs from the schema")
    text = render()
    if not parser.parse_args().check:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT}")
        return 0
    if OUTPUT.exists() and OUTPUT.read_text() == text:
        return 0
    print(f"{OUTPUT} is out of date with the config schema: run `python docs/gen_config_reference.py`")
    return 1


if __name__ == "__main__":
    sys.exit(main())

"""pydantic's validation messages in the words of our other messages: what the key expects ("expected at least 1",
"expected a whole number"), not pydantic's "Input should be ..."."""

from __future__ import annotations

from typing import Any

_FIXED = {
    "finite_number": "expected a finite number",
    "int_parsing": "expected a whole number",
    "int_type": "expected a whole number",
    "int_from_float": "expected a whole number",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "string_type": "expected text",
    "list_type": "expected a list, e.g. [a, b]",
    "dict_type": "expected a mapping, e.g. {key: value}",
}
_BOUNDS = {
    "greater_than_equal": ("ge", "at least"),
    "greater_than": ("gt", "more than"),
    "less_than_equal": ("le", "at most"),
    "less_than": ("lt", "less than"),
}


def expected(error: dict[str, Any]) -> str:
    """What ``error`` (one of pydantic's ``ValidationError.errors()``) says is expected, in our words; a message
    of our own validators (``Value error, ...``) as it is."""
    kind, context = error["type"], error.get("ctx") or {}
    if kind in _FIXED:
        return _FIXED[kind]
    if kind in _BOUNDS:
        name, words = _BOUNDS[kind]
        bound = context[name]
        return f"expected {words} {int(bound) if isinstance(bound, float) and bound.is_integer() else bound}"
    if kind in ("literal_error", "enum"):
        return f"expected {context['expected']}"
    return str(error["msg"]).removeprefix("Value error, ")

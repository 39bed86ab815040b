"""Config messages in our own words: what a key expects, not pydantic's "Input should be ..."; an unknown key
given twice on the command line is one problem."""

from __future__ import annotations

import pytest
from bad_input_helpers import config_error

PREFIX = "invalid configuration:\n  "


def test_an_unknown_key_given_twice_is_one_line() -> None:
    line = "unknown config key 'training.lr' (did you mean 'training.optimizer.lr'?)"
    message = config_error("training.lr=1e-3", "training.lr=2e-3", "training.seed=1")
    assert message.count("\n") == 1 and message.partition("; allowed here: ")[0] == PREFIX + line


@pytest.mark.parametrize(
    "override, expected",
    [
        ("training.max_minutes=abc", "'abc': expected a number"),
        ("model.num_channels=1.5", "1.5: expected a whole number"),
        ("model.compile=3", "3: expected a list, e.g. [a, b]"),
        ("training.cuda_graphs=sometimes", "'sometimes': expected true or false"),
        ("training.optimizer.lr=-inf", "-inf: expected a finite number"),
    ],
)
def test_pydantic_messages_are_in_our_words(override: str, expected: str) -> None:
    """What a key expects, said as our other messages say it, not pydantic's "Input should be ..."."""
    key = override.split("=")[0]
    assert config_error(override) == f"{PREFIX}config key '{key}' = {expected}"

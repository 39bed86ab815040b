"""The run config a checkpoint stores (JSON), validated by this version of the package: a config another version
wrote, or one edited since, is refused with one message naming the file, the versions and each key at fault."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

import anemo_like
from anemo_like.config.schema import RunConfig
from anemo_like.config.validate import config_problems


def stored_run_config(text: str, path: Path, *, what: str, version: str | None, also: str = "") -> RunConfig:
    """The config ``text`` stored in ``path`` (a ``what``, written by anemo_like ``version``; None: the file records
    none); ValueError when it does not validate, saying what to do (``also``: one more way out)."""
    try:
        return RunConfig.model_validate_json(text)
    except ValidationError as error:
        problems = config_problems(error, json.loads(text), RunConfig)
    current = anemo_like.__version__
    if version is None:
        written, todo = "it records no version", "use the anemo_like version that wrote it"
    elif version == current:
        written, todo = "it was written by this version, so it was edited since", "use an unedited copy"
    else:
        written, todo = f"it was written by anemo_like {version}", f"use anemo_like {version} to read it"
    advice = f"{todo}, or train the model again with this version{also}"
    raise ValueError(
        f"{path} is not a usable {what}: the config stored in it does not validate with anemo_like {current} "
        f"({written}): {advice}; the keys at fault:\n  " + "\n  ".join(problems)
    )

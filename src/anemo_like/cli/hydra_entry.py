"""The shared front of every Hydra command: check the override keys, compose, validate, then run.

The config is validated before torch is imported, so a bad key fails in well under a second. Errors the user
can fix (bad config, config/dataset mismatch) print one message and exit with status 2.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TypeVar

import hydra
from omegaconf import DictConfig, OmegaConf

from anemo_like.config import ConfigError, RunConfig, config_dir, validate_config
from anemo_like.config.validate import check_override_keys

LOG = logging.getLogger("anemo_like")
T = TypeVar("T")


def set_up_or_exit(set_up: Callable[[], T]) -> T:
    """Run a setup step that checks the config against the dataset: a mismatch is the user's to fix, so it
    prints one message and exits with status 2 instead of a traceback."""
    try:
        return set_up()
    except (ValueError, FileNotFoundError) as exc:
        LOG.error("%s", exc)
        sys.exit(2)


def run_hydra_command(program: str, run: Callable[[RunConfig], None], argv: list[str]) -> None:
    """``program --config-name=NAME key=value ...``: compose ``training/config``, validate, call ``run``."""
    try:
        check_override_keys(argv)
    except ConfigError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        sys.exit(2)

    def composed(cfg: DictConfig) -> None:
        try:
            config = validate_config(OmegaConf.to_container(cfg, resolve=True))
        except ConfigError as exc:
            LOG.error("%s", exc)
            sys.exit(2)
        run(config)

    sys.argv = [program, *argv]
    hydra.main(config_path=str(config_dir()), config_name="quickstart", version_base="1.3")(composed)()

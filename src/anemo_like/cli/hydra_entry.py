"""The shared front of every Hydra command: check the override keys, compose, validate, then run.

The config is validated before torch is imported, so a bad key fails in well under a second. Errors the user
can fix (bad config, config/dataset mismatch) print one message and exit with status 2. Any other failure prints
one paragraph naming the error and exits with status 1; ``--debug`` (anywhere on the command line) shows the
full traceback instead.
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
DEBUG_FLAG = "--debug"
_debug = False  # set from the command line by run_hydra_command


def set_up_or_exit(set_up: Callable[[], T]) -> T:
    """Run a setup step that checks the config against the dataset: a mismatch is the user's to fix, so it
    prints one message and exits with status 2 instead of a traceback."""
    try:
        return set_up()
    except (ValueError, FileNotFoundError) as exc:
        if _debug:
            raise
        LOG.error("%s", exc)
        sys.exit(2)


def run_hydra_command(program: str, run: Callable[[RunConfig], None], argv: list[str]) -> None:
    """``program [--debug] --config-name=NAME key=value ...``: compose ``training/config``, validate, call ``run``."""
    global _debug
    debug = _debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
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
        if debug:
            run(config)
            return
        try:
            run(config)
        except Exception as exc:  # one paragraph for the user; --debug shows where it came from
            LOG.error(
                "%s failed: %s: %s\n(run again with --debug for the full traceback)", program, type(exc).__name__, exc
            )
            sys.exit(1)

    sys.argv = [program, *argv]
    hydra.main(config_path=str(config_dir()), config_name="quickstart", version_base="1.3")(composed)()

"""The shared front of every Hydra command: check the override keys, compose, validate, then run.

The config is validated before torch is imported, so a bad key fails in well under a second. Errors the user
can fix (bad config, config/dataset mismatch) print one message and exit with status 2. Any other failure prints
one paragraph naming the error and exits with status 1; ``--debug`` (anywhere on the command line) shows the
full traceback instead. SIGTERM, SIGINT and SIGUSR1 are handled in every phase (:mod:`anemo_like.interrupts`): one
line, and status 0 when the work is saved, else 128 + the signal number; a second signal while the command stops
changes neither.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import hydra
from omegaconf import DictConfig, OmegaConf

from anemo_like.config import ConfigError, RunConfig, config_dir, validate_config
from anemo_like.config.validate import check_override_keys
from anemo_like.config.yaml_errors import check_yaml_files, config_dirs
from anemo_like.interrupts import Interrupted, handling_signals, phase
from anemo_like.training.preemption import Preempted

LOG = logging.getLogger("anemo_like")
T = TypeVar("T")
C = TypeVar("C")
DEBUG_FLAG = "--debug"
_debug = False  # set from the command line by run_hydra_command


def set_up_or_exit(set_up: Callable[[], T]) -> T:
    """Run a setup step that checks the config against the dataset: a mismatch is the user's to fix, so it
    prints one message and exits with status 2 instead of a traceback."""
    try:
        with phase("set-up"):
            return set_up()
    except (ValueError, FileNotFoundError) as exc:
        if _debug:
            raise
        LOG.error("%s", exc)
        sys.exit(2)


@contextlib.contextmanager
def training_process_group(config: RunConfig) -> Iterator[None]:
    """The process group of a training command launched with several ranks, opened here and closed on every exit
    path (nothing for a single process). The commands own it, not the trainer."""
    from anemo_like.distributed.environment import process_group

    hardware = config.system.hardware
    with process_group(hardware.accelerator, timeout_minutes=hardware.collective_timeout_minutes):
        yield


def run_hydra_command(
    program: str,
    run: Callable[[C], None],
    argv: list[str],
    *,
    config_path: Path | None = None,
    default_config: str = "quickstart",
    validate: Callable[[Mapping[str, Any]], C] = validate_config,
    check_keys: Callable[[list[str]], None] = check_override_keys,
) -> None:
    """``program [--debug] --config-name=NAME key=value ...``: compose, validate, call ``run``.

    The defaults are the training tree (``training/config``) and :class:`RunConfig`; another command passes its own
    tree (``config_path``), default config name, ``validate`` (mapping -> validated config) and ``check_keys``.
    """
    global _debug
    debug = _debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    with handling_signals():
        try:
            _compose_and_run(program, run, argv, debug, config_path, default_config, validate, check_keys)
        except Interrupted as stop:  # unwound: writes finished or abandoned, the process group closed
            print(f"{program}: {stop.report()}", file=sys.stderr, flush=True)
            _exit(stop.exit_code)
        except Preempted:  # the training loop logged its stop, its checkpoint and status 0
            _exit(0)


def _exit(status: int) -> None:
    """Flush the logs and exit with ``status`` while the signal handlers are still installed: a second signal now
    is only noted, so the status is the one the last line gives (not 128 + signal). Not sys.exit: a reader thread
    blocked in I/O must not hold up the exit."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _compose_and_run(
    program: str,
    run: Callable[[C], None],
    argv: list[str],
    debug: bool,
    config_path: Path | None,
    default_config: str,
    validate: Callable[[Mapping[str, Any]], C],
    check_keys: Callable[[list[str]], None],
) -> None:
    try:
        check_keys(argv)
        check_yaml_files(config_dirs(argv, config_dir() if config_path is None else config_path))
        check_hydra_run_dir(argv)
    except ConfigError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        sys.exit(2)

    def composed(cfg: DictConfig) -> None:
        try:
            config = validate(OmegaConf.to_container(cfg, resolve=True))
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
    tree = config_dir() if config_path is None else config_path
    hydra.main(config_path=str(tree), config_name=default_config, version_base="1.3")(composed)()


def check_hydra_run_dir(argv: list[str]) -> None:
    """Hydra creates its run folder before anything of ours runs, with a traceback when it cannot: check the
    folder first (``hydra.run.dir=`` on the command line, else the current folder, where the default lies)."""
    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.run.dir=")]
    if given and "${" not in given[-1]:
        folder = Path(given[-1]).expanduser().absolute()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise ConfigError(
                f"hydra.run.dir {folder} cannot be created ({error.strerror}); choose a folder you can write"
            ) from None
    elif not given and not os.access(Path.cwd(), os.W_OK):
        raise ConfigError(
            f"the run folder cannot be created in {Path.cwd()} (not writable): start in a folder you can write, "
            "or set hydra.run.dir=..."
        )

"""The shared front of every Hydra command: check the override keys, compose, validate, then run.

The config is validated before torch is imported, so a bad key fails in well under a second; the overrides are
checked before Hydra composes, and its errors are worded as one line (:mod:`anemo_like.cli.overrides`). Errors the
user can fix (bad config, config/dataset mismatch) print one message and exit with status 2. Any other failure prints
one paragraph naming the error and exits with status 1; ``--debug`` (anywhere on the command line) shows the
full traceback instead. SIGTERM, SIGINT and SIGUSR1 are handled in every phase (:mod:`anemo_like.interrupts`): one
line, and status 0 when the work is saved, else 128 + the signal number; a second signal while the command stops
changes neither.

A command that writes into a run folder (``claims_run_folder``) claims it first (:func:`claimed_run_folder`), and
Hydra's own record (``.hydra/`` and the log file) is written only once the claim holds: a refused run leaves the
folder it was refused as it was. Hydra itself writes nothing for it (``hydra.output_subdir=null``, no log file).
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from anemo_like.cli.overrides import check_overrides, composition_error, interpolation_error
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
# Hydra's record of a run that claims its folder, written by the front once the claim holds (unless the command
# line sets these keys itself)
DEFERRED_RECORD = ("hydra.output_subdir=null",)
DEFERRED_LOG = ("~hydra.job_logging.handlers.file", "hydra.job_logging.root.handlers=[console]")
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's default log file format
_record: Callable[[], None] | None = None  # writes Hydra's record once (keep_hydra_record)


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
def claimed_run_folder(config: RunConfig) -> Iterator[None]:
    """The run folder (``system.paths.output``) claimed for the run's life: rank 0 locks it and checks it holds no
    other run (:func:`~anemo_like.training.run_folder.claim_run_folder`), every rank exits 2 with its message when
    it is refused; then Hydra's record is written. Inside the process group."""
    from anemo_like.distributed.environment import launch_environment, rank_zero_value
    from anemo_like.training.run_folder import RunFolderClaim, claim_run_folder

    launch = launch_environment()
    run_dir = Path(config.system.paths.output).expanduser()

    def claim() -> RunFolderClaim:
        claimed, refusal = RunFolderClaim(run_dir=run_dir, descriptor=None), None
        if launch.rank == 0:
            try:
                claimed = claim_run_folder(run_dir, resume=config.training.resume)
            except ValueError as exc:
                refusal = exc
        message = rank_zero_value("" if refusal is None else str(refusal), launch)
        if refusal is not None:
            raise refusal
        if message:
            raise ValueError(message)
        return claimed

    with set_up_or_exit(claim):
        keep_hydra_record()
        yield


def keep_hydra_record() -> None:
    """Write what Hydra writes on start, held back until now: ``.hydra/`` (config.yaml, hydra.yaml,
    overrides.yaml) and the log file ``<job name>.log`` with the lines logged so far. Once; nothing outside a
    Hydra command."""
    global _record
    record, _record = _record, None
    if record is not None:
        record()


def _hold_back_record(cfg: DictConfig, deferred: tuple[str, ...]) -> None:
    """Keep Hydra's record of this run in memory (log lines included) until :func:`keep_hydra_record`."""
    global _record
    hydra_cfg = HydraConfig.instance().cfg
    output = Path(HydraConfig.get().runtime.output_dir)
    files = {"config": cfg, "hydra": hydra_cfg, "overrides": hydra_cfg.hydra.overrides.task}
    write_files, write_log = DEFERRED_RECORD[0] in deferred, DEFERRED_LOG[0] in deferred
    lines = logging.handlers.MemoryHandler(capacity=100_000, flushLevel=logging.CRITICAL + 1)
    if write_log:
        logging.getLogger().addHandler(lines)

    def write() -> None:
        if write_files:
            (output / ".hydra").mkdir(parents=True, exist_ok=True)
            for name, part in files.items():
                (output / ".hydra" / f"{name}.yaml").write_text(OmegaConf.to_yaml(part), encoding="utf-8")
        if write_log:
            log_file = logging.FileHandler(output / f"{HydraConfig.get().job.name}.log")
            log_file.setFormatter(logging.Formatter(LOG_FORMAT))
            lines.setTarget(log_file)
            lines.flush()
            logging.getLogger().removeHandler(lines)
            logging.getLogger().addHandler(log_file)

    _record = write


def _deferred_overrides(argv: list[str]) -> tuple[str, ...]:
    """The Hydra overrides that hold Hydra's record back, less those whose keys the command line sets itself."""
    keys = {a.lstrip("~+").split("=", 1)[0].replace("/", ".") for a in argv}
    record = () if "hydra.output_subdir" in keys else DEFERRED_RECORD
    log = () if any(k.startswith("hydra.job_logging") for k in keys) else DEFERRED_LOG
    return record + log


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
    claims_run_folder: bool = False,
) -> None:
    """``program [--debug] --config-name=NAME key=value ...``: compose, validate, call ``run``.

    The defaults are the training tree (``training/config``) and :class:`RunConfig`; another command passes its own
    tree (``config_path``), default config name, ``validate`` (mapping -> validated config) and ``check_keys``.
    ``claims_run_folder``: ``run`` claims the run folder (:func:`claimed_run_folder`) before Hydra's record is
    written; otherwise Hydra writes it on start.
    """
    global _debug
    debug = _debug = DEBUG_FLAG in argv
    argv = [a for a in argv if a != DEBUG_FLAG]
    with handling_signals():
        try:
            _compose_and_run(
                program, run, argv, debug, config_path, default_config, validate, check_keys, claims_run_folder
            )
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
    claims_run_folder: bool,
) -> None:
    tree = config_dir() if config_path is None else config_path
    directories = config_dirs(argv, tree)
    try:
        check_overrides(argv, directories)
        check_keys(argv)
        check_yaml_files(directories)
        check_hydra_run_dir(argv)
    except ConfigError as exc:
        print(f"{program}: {exc}", file=sys.stderr)
        sys.exit(2)

    deferred = _deferred_overrides(argv) if claims_run_folder else ()

    def composed(cfg: DictConfig) -> None:
        _hold_back_record(cfg, deferred)
        try:
            config = validate(OmegaConf.to_container(cfg, resolve=True))
        except ConfigError as exc:
            LOG.error("%s", exc)
            sys.exit(2)
        except OmegaConfBaseException as exc:  # an interpolation (${...}) that names nothing
            LOG.error("invalid configuration:\n  %s", interpolation_error(exc, cfg))
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

    # ours go beside the command line's overrides: Hydra's argument parser wants them in one run
    overrides = [i for i, a in enumerate(argv) if not a.startswith("-") and ("=" in a or a.startswith("~"))]
    after = overrides[-1] + 1 if overrides else len(argv)
    sys.argv = [program, *argv[:after], *deferred, *argv[after:]]
    try:
        with _hydra_raising():
            hydra.main(config_path=str(tree), config_name=default_config, version_base="1.3")(composed)()
    except HydraException as error:
        if debug:
            raise
        print(f"{program}: invalid configuration:\n  {composition_error(error, argv)}", file=sys.stderr)
        sys.exit(2)


@contextlib.contextmanager
def _hydra_raising() -> Iterator[None]:
    """Hydra raises its errors (composing the config) instead of printing them with its hints and exiting 1."""
    previous = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HYDRA_FULL_ERROR")
        else:
            os.environ["HYDRA_FULL_ERROR"] = previous


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

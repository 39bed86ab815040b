"""``anemo-infer --config-name=NAME key=value ...``: forecasts from a trained inference checkpoint, then verification.

Same conventions as ``anemo-train``: the config (``inference/config``) is validated before torch is imported; config
and setup errors exit 2 with one message, other failures exit 1 with one paragraph; ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import sys

from anemo_like.cli.hydra_entry import run_hydra_command, set_up_or_exit
from anemo_like.config.inference import (
    InferenceConfig,
    check_inference_override_keys,
    inference_config_dir,
    validate_inference_config,
)


def _infer(config: InferenceConfig) -> None:
    from anemo_like.distributed.environment import process_group
    from anemo_like.inference.run import prepare, run  # torch and friends: only once the config is known good
    from anemo_like.runtime.process_memory import current_rss_mib

    runtime_mib = current_rss_mib()  # the interpreter and imports, before the process group
    with process_group(config.device, timeout_minutes=config.collective_timeout_minutes):  # several ranks
        run(set_up_or_exit(lambda: prepare(config, runtime_mib=runtime_mib)))


def dates_given_win(argv: list[str]) -> list[str]:
    """``argv`` where the initial dates given on the command line replace the config file's other way of giving
    them: ``dates=[...]`` clears a ``date_range`` the file sets, ``date_range.start=`` a ``dates`` list (both given on
    the command line: refused by the config check)."""
    keys = {a.lstrip("+~").partition("=")[0] for a in argv if "=" in a}
    if "dates" in keys and not any(k.startswith("date_range") for k in keys):
        return [*argv, "date_range.start=null", "date_range.end=null"]
    if "date_range.start" in keys and "dates" not in keys:
        return [*argv, "dates=null"]
    return argv


def main() -> None:
    run_hydra_command(
        "anemo-infer",
        _infer,
        dates_given_win(sys.argv[1:]),
        config_path=inference_config_dir(),
        default_config="default",
        validate=validate_inference_config,
        check_keys=check_inference_override_keys,
    )


if __name__ == "__main__":
    main()

"""``anemo-train --config-name=NAME key=value ...``: validate the composed config, then train."""

from __future__ import annotations

import sys
from pathlib import Path

from anemo_like.cli.hydra_entry import claimed_run_folder, run_hydra_command, set_up_or_exit, training_process_group
from anemo_like.config import RunConfig
from anemo_like.tracking.background import SenderProcess


def _train(config: RunConfig) -> None:
    # the tracking sender imports MLflow on another core while this process imports torch and sets up
    sender = SenderProcess.for_config(config.diagnostics.tracking, Path(config.system.paths.output))
    from anemo_like.training.trainer import Trainer  # torch and friends: only once the config is known good

    with training_process_group(config), claimed_run_folder(config):
        set_up_or_exit(lambda: Trainer(config, tracking_sender=sender)).fit()


def main() -> None:
    run_hydra_command("anemo-train", _train, sys.argv[1:], claims_run_folder=True)


if __name__ == "__main__":
    main()

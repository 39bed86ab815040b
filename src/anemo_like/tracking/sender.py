"""The sender process: ``python -m anemo_like.tracking.sender RUN_DIR URI EVERY_S``.

Started by the training process (:class:`~anemo_like.tracking.background.SenderProcess`) while the run is set up,
it copies the run's new events to the tracking server at once and then every ``EVERY_S`` seconds. MLflow's
import, its store and every request run here, not in the training process, so they never hold the training's
interpreter lock. A line ``stop`` on its stdin, or the end of stdin (the training process ended or died), makes
one last attempt; the exit status is 0 when the server then holds the whole run, 3 when not.
"""

from __future__ import annotations

import logging
import select
import sys
from pathlib import Path

from anemo_like.tracking.mlflow_target import MlflowTarget
from anemo_like.tracking.record import RunRecord
from anemo_like.tracking.sync import sync

LOG = logging.getLogger(__name__)
MAX_BACKOFF_S = 60.0


class Sender:
    """Attempts to send; a failing server is reported in one warning line, and one when it answers again."""

    def __init__(self, record: RunRecord, uri: str) -> None:
        self.record, self.uri = record, uri
        self.target: MlflowTarget | None = None
        self.failing = False

    def send(self) -> bool:
        """One attempt; True when the server holds every event recorded so far."""
        try:
            if self.target is None:
                self.target = MlflowTarget(self.uri)
            sync(self.record, self.target)
        except Exception as error:  # whatever the server or the network does, the run goes on
            if not self.failing:
                LOG.warning(
                    "tracking: %s did not accept the run's events (%s: %s); training goes on, the events stay in "
                    "%s and are sent when the server answers (or later: anemo-sync %s)",
                    self.uri, type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "",
                    self.record.folder, self.record.run_dir,
                )  # fmt: skip
            self.failing = True
            return False
        if self.failing:
            LOG.info("tracking: %s answers again; the run's events are sent", self.uri)
        self.failing = False
        return True


def stop_requested(wait_s: float) -> bool:
    """Wait up to ``wait_s`` for a line on stdin; True for ``stop`` or the end of stdin."""
    ready, _, _ = select.select([sys.stdin], [], [], wait_s)
    if not ready:
        return False
    line = sys.stdin.readline()
    return line == "" or line.strip() == "stop"


def main(argv: list[str] | None = None) -> None:
    run_dir, uri, every_s = argv or sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    sender, wait = Sender(RunRecord(Path(run_dir)), uri), float(every_s)
    sender.send()  # at once: MLflow's import and the store's opening overlap the run's set-up
    while not stop_requested(wait):
        wait = float(every_s) if sender.send() else min(2 * wait, MAX_BACKOFF_S)
    sys.exit(0 if sender.send() else 3)


if __name__ == "__main__":
    main()

"""The sender process: ``python -m anemo_like.tracking.sender URI EVERY_S``.

Started by the training process (:class:`~anemo_like.tracking.background.SenderProcess`) before it imports torch,
it imports MLflow and opens the store at ``URI`` on another core, then waits for one line on stdin: the run as
JSON (``{"run_dir": ..., "uri": ...}``), or ``{"cancel": true}`` / the end of stdin (nothing to track). It then
sends the run's new events at once and every ``EVERY_S`` seconds. MLflow's import, its store and every request run
here, not in the training process, so they never hold the training's interpreter lock. A line ``stop``, or the
end of stdin (the training process ended or died), makes one last attempt; the exit status is 0 when the server
then holds the whole run, 3 when not.
"""

from __future__ import annotations

import json
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

    def __init__(self, record: RunRecord, uri: str, target: MlflowTarget | None = None) -> None:
        self.record, self.uri, self.target = record, uri, target
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


def warm_target(uri: str) -> MlflowTarget | None:
    """MLflow imported and the store at ``uri`` opened (None when that fails: :class:`Sender` tries again)."""
    try:
        return MlflowTarget(uri)
    except Exception:
        return None


def main(argv: list[str] | None = None) -> None:
    uri, every_s = argv or sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    target = warm_target(uri)
    line = sys.stdin.readline()
    request = json.loads(line) if line.strip() else {"cancel": True}
    if request.get("cancel"):
        return
    run_uri = request["uri"]
    sender = Sender(RunRecord(Path(request["run_dir"])), run_uri, target if run_uri == uri else None)
    wait = float(every_s)
    sender.send()
    while not stop_requested(wait):
        wait = float(every_s) if sender.send() else min(2 * wait, MAX_BACKOFF_S)
    sys.exit(0 if sender.send() else 3)


if __name__ == "__main__":
    main()

"""The training side of the sender: starts the sender process, hands it the run, and stops it at the end."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

from anemo_like.config.system_schema import TrackingConfig
from anemo_like.tracking.mlflow_target import default_tracking_uri
from anemo_like.tracking.record import RunRecord

LOG = logging.getLogger(__name__)


class SenderProcess:
    """Runs :mod:`anemo_like.tracking.sender` beside the training. Started early (:meth:`for_config`, before the
    training process imports torch), it imports MLflow and opens the store on another core while the training sets
    up; :meth:`begin` then hands it the run. The events wait in the run folder, so nothing is queued in memory and
    nothing is lost when the server or the sender fails."""

    def __init__(self, uri: str, *, every_s: float) -> None:
        self.uri = uri
        self.record: RunRecord | None = None
        command = [sys.executable, "-m", "anemo_like.tracking.sender", uri, str(every_s)]
        # its own session: a Ctrl-C meant for the training does not cut a send short; the end of its stdin stops it
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True, start_new_session=True)

    @classmethod
    def for_config(cls, config: TrackingConfig, output: Path) -> SenderProcess | None:
        """The sender of a run writing into ``output`` (None when tracking is off). A resumed run whose record names
        another tracking URI gets a sender of its own in :class:`~anemo_like.tracking.tracker.Tracker`."""
        if config.backend == "none":
            return None
        return cls(config.tracking_uri or default_tracking_uri(output), every_s=config.send_every_s)

    def begin(self, record: RunRecord) -> None:
        """Send ``record``'s events from now on."""
        self.record = record
        self._tell({"run_dir": str(record.run_dir), "uri": self.uri})

    def cancel(self) -> None:
        """This process tracks nothing (a rank other than 0): the sender exits without sending."""
        self._tell({"cancel": True}, last=True)
        self.process.wait()

    def close(self, timeout_s: float = 120.0) -> bool:
        """Ask for one last attempt and wait for it; True when the server holds the whole run."""
        self._tell("stop", last=True)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if code == 0 or self.record is None:
            return code == 0
        pending = len(self.record.events(self.record.sync_state(self.uri)["sent"]))
        LOG.warning(
            "tracking: %d event(s) of this run are not on %s yet; send them with: anemo-sync %s",
            pending, self.uri, self.record.run_dir,
        )  # fmt: skip
        return False

    def _tell(self, message: dict | str, *, last: bool = False) -> None:
        """One line to the sender (``last``: then its stdin is closed); a sender already gone is not an error."""
        try:
            self.process.stdin.write((message if isinstance(message, str) else json.dumps(message)) + "\n")
            self.process.stdin.flush()
            if last:
                self.process.stdin.close()
        except (OSError, ValueError):  # a broken pipe, or stdin closed already
            pass

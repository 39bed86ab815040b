"""The training side of the background sender: starts the sender process and stops it at the end of the run."""

from __future__ import annotations

import logging
import subprocess
import sys

from anemo_like.tracking.record import RunRecord

LOG = logging.getLogger(__name__)


class SenderProcess:
    """Runs :mod:`anemo_like.tracking.sender` beside the training. The events wait in the run folder, so nothing is
    queued in memory and nothing is lost when the server or the sender fails."""

    def __init__(self, record: RunRecord, uri: str, *, every_s: float) -> None:
        self.record, self.uri, self.every_s = record, uri, every_s
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [sys.executable, "-m", "anemo_like.tracking.sender", str(self.record.run_dir), self.uri,
                   str(self.every_s)]  # fmt: skip
        # its own session: a Ctrl-C meant for the training does not cut a send short; the end of its stdin stops it
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, text=True, start_new_session=True)

    def close(self, timeout_s: float = 120.0) -> bool:
        """Ask for one last attempt and wait for it; True when the server holds the whole run."""
        if self.process is None:
            return False
        try:
            self.process.stdin.write("stop\n")
            self.process.stdin.close()
        except OSError:  # the sender is gone already
            pass
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        if code == 0:
            return True
        pending = len(self.record.events(self.record.sync_state(self.uri)["sent"]))
        LOG.warning(
            "tracking: %d event(s) of this run are not on %s yet; send them with: anemo-sync %s",
            pending, self.uri, self.record.run_dir,
        )  # fmt: skip
        return False

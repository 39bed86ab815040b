"""The run's tracking record in ``RUN_DIR/tracking/``, the source every server copy is made from.

- ``run.json``: who the run is (experiment, run name, tags, the configured tracking URI, start time);
- ``events.jsonl``: every parameter, metric, tag, artifact and status change in the order logged, one JSON object
  per line, appended and never rewritten;
- ``sync.json``: per tracking URI, the MLflow run id there and how many events that server has acknowledged.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG = logging.getLogger(__name__)
FOLDER = "tracking"


def now_ms() -> int:
    """Milliseconds since the epoch, MLflow's timestamps."""
    return int(time.time() * 1000)


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON at ``path`` via a temporary sibling and a rename: a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(value, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class RunIdentity:
    """What names the run on every server: stored once in ``run.json``."""

    experiment_name: str
    run_name: str
    tags: dict[str, str]
    tracking_uri: str
    start_time_ms: int


class RunRecord:
    """Append-only events of one run, and the per-server sync state, in ``run_dir/tracking``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.folder = run_dir / FOLDER
        self.events_path = self.folder / "events.jsonl"
        self.identity_path = self.folder / "run.json"
        self.sync_path = self.folder / "sync.json"

    def exists(self) -> bool:
        return self.identity_path.is_file()

    def create(self, identity: RunIdentity) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.identity_path, identity.__dict__)
        self.events_path.touch()

    def identity(self) -> RunIdentity:
        try:
            return RunIdentity(**json.loads(self.identity_path.read_text()))
        except (OSError, ValueError, TypeError) as error:
            raise ValueError(
                f"{self.identity_path} is not a tracking record of this package ({error}); was {self.run_dir} "
                "trained with diagnostics.tracking.backend=mlflow?"
            ) from None

    def append(self, event: dict[str, Any]) -> None:
        """One event as one line (one write call: a reader sees whole lines only)."""
        with self.events_path.open("a") as f:
            f.write(json.dumps(event) + "\n")

    def events(self, start: int = 0) -> list[dict[str, Any]]:
        """The complete events from number ``start`` on (a line still being written is not returned)."""
        found = []
        with self.events_path.open() as f:
            for number, line in enumerate(f):
                if number < start:
                    continue
                if not line.endswith("\n"):
                    break
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    LOG.warning("%s line %d is not JSON (a write cut short?): skipped", self.events_path, number + 1)
                    found.append({})
        return found

    def sync_state(self, uri: str) -> dict[str, Any]:
        """``{"run_id": str | None, "sent": int}`` for ``uri``."""
        states = json.loads(self.sync_path.read_text()) if self.sync_path.is_file() else {}
        return states.get(uri, {"run_id": None, "sent": 0})

    def save_sync_state(self, uri: str, *, run_id: str, sent: int) -> None:
        states = json.loads(self.sync_path.read_text()) if self.sync_path.is_file() else {}
        states[uri] = {"run_id": run_id, "sent": sent}
        write_json(self.sync_path, states)

    def logged_steps(self) -> dict[str, int]:
        """Metric key -> the last step recorded for it (a resumed run does not record those steps twice)."""
        last: dict[str, int] = {}
        for event in self.events():
            for metric in event.get("metrics", []):
                last[metric["key"]] = max(metric["step"], last.get(metric["key"], -1))
        return last

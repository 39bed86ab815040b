"""The run's ``metrics.jsonl`` (one JSON record per logged step and per validation) and the training losses
summed between two log lines."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from anemo_like.tracking.tracker import Tracker

LOG = logging.getLogger(__name__)


class MetricsLog:
    """Append-only JSON-lines metrics file; on resume, records after the resumed step are dropped. Every record
    written also goes to ``tracker`` (experiment tracking), when there is one."""

    def __init__(self, path: Path, *, keep_until_step: int, write: bool = True, tracker: Tracker | None = None) -> None:
        self.path = path
        self.tracker = tracker
        self.records: list[dict] = []
        self.enabled = write  # other data-parallel ranks keep records in memory only
        if not write:
            return
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    LOG.warning("%s line %d is not JSON (a write cut short?): dropped", path, number)
                    continue
                if record["step"] <= keep_until_step:
                    self.records.append(record)
        path.write_text("".join(json.dumps(r) + "\n" for r in self.records))

    def has(self, step: int, key: str) -> bool:
        """Whether a record of ``step`` holds ``key``."""
        return any(record["step"] == step and key in record for record in self.records)

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.tracker is not None:
            self.tracker.log_metrics(record)
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


@dataclass
class LossWindow:
    """Training losses summed on the device since the last log line."""

    device: torch.device
    total: torch.Tensor = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        self.reset()

    def add(self, loss: torch.Tensor) -> None:
        self.total += loss
        self.count += 1

    def reset(self) -> None:
        self.total, self.count = torch.zeros((), device=self.device), 0

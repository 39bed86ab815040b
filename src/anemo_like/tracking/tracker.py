"""What a training run calls to track itself (rank 0 only): parameters, metrics, artifacts and its status."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from anemo_like.config.system_schema import TrackingConfig
from anemo_like.tracking.background import SenderProcess
from anemo_like.tracking.mlflow_target import NEEDS_MLFLOW, TrackingUnavailable, default_tracking_uri
from anemo_like.tracking.record import RunIdentity, RunRecord, now_ms

PARAM_VALUE_CHARS = 6000  # MLflow's limit on one parameter value


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``: parameters as MLflow stores them (lists as JSON)."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:PARAM_VALUE_CHARS]
    return flat


class Tracker:
    """Records a run's tracking events in its folder and has them sent in the background. A run folder that
    already holds a record is the same run resumed: it continues the same MLflow run, and metrics of steps already
    recorded (re-run after the resumed checkpoint) are not recorded twice."""

    def __init__(self, config: TrackingConfig, run_dir: Path, *, sender: SenderProcess | None = None) -> None:
        if importlib.util.find_spec("mlflow") is None:
            raise TrackingUnavailable(NEEDS_MLFLOW)
        self.config = config
        self.record = RunRecord(run_dir)
        self.resumed = self.record.exists()
        if not self.resumed:
            self.record.create(
                RunIdentity(
                    experiment_name=config.experiment_name,
                    run_name=config.run_name or run_dir.resolve().name,
                    tags=dict(config.tags),
                    tracking_uri=config.tracking_uri or default_tracking_uri(run_dir),
                    start_time_ms=now_ms(),
                )
            )
        self.uri = self.record.identity().tracking_uri
        self.recorded_steps = self.record.logged_steps()
        if sender is None or sender.uri != self.uri:  # none started early, or a resumed run's record names another
            if sender is not None:
                sender.cancel()
            sender = SenderProcess(self.uri, every_s=config.send_every_s)
        self.sender = sender
        self.sender.begin(self.record)

    def start(self, *, params: dict[str, Any], tags: dict[str, str], config_yaml: str, step: int) -> None:
        """Record the run's parameters (once per run), tags and resolved config, as training starts at ``step``."""
        if self.resumed:
            self.record.append({"status": "RUNNING", "timestamp": now_ms()})
            self.record.append({"tags": {**tags, "anemo_like.resumed_from_step": str(step)}})
            name = f"config-resumed-at-step-{step}.yaml"
        else:
            self.record.append({"params": flatten(params)})
            self.record.append({"tags": tags})
            name = "config.yaml"
        (self.record.folder / name).write_text(config_yaml)
        self.log_artifact(self.record.folder / name)

    def log_metrics(self, record: dict[str, Any]) -> None:
        """A metrics.jsonl record (``step`` and named numbers) as MLflow metrics of that step."""
        step, stamp = int(record["step"]), now_ms()
        metrics = [
            {"key": key, "value": float(value), "step": step, "timestamp": stamp}
            for key, value in record.items()
            if key != "step" and isinstance(value, int | float) and not isinstance(value, bool)
            if step > self.recorded_steps.get(key, -1)
        ]
        if metrics:
            self.record.append({"metrics": metrics})

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """A file, uploaded as it is when sent (recorded relative to the run folder when inside it)."""
        path, run_dir = path.resolve(), self.record.run_dir.resolve()
        name = path.relative_to(run_dir) if path.is_relative_to(run_dir) else path
        self.record.append({"artifact": str(name), "artifact_path": artifact_path})

    def finish(self, status: str) -> bool:
        """Record the end (``FINISHED``, ``FAILED`` or ``KILLED``), stop the sender after its last attempt; True
        when the server holds the whole run."""
        self.record.append({"status": status, "timestamp": now_ms()})
        return self.sender.close()

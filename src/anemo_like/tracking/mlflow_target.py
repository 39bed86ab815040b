"""One MLflow run at one tracking URI, filled from a run record's events (MLflow is imported here, lazily)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from anemo_like.tracking.record import RunIdentity

# MLflow's log_batch limits per call
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100


class TrackingUnavailable(RuntimeError):
    """MLflow is not installed."""


NEEDS_MLFLOW = "diagnostics.tracking.backend=mlflow needs MLflow: pip install 'anemo-like[tracking]'"


def default_tracking_uri(run_dir: Path) -> str:
    """A local MLflow store beside the run folder: ``sqlite:///<parent>/mlflow.db`` (no server needed)."""
    return f"sqlite:///{run_dir.resolve().parent / 'mlflow.db'}"


def local_artifact_root(uri: str) -> str | None:
    """Where a local sqlite store keeps artifacts (``mlartifacts`` beside the database); None for a server."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).parent / "mlartifacts").as_uri()


class MlflowTarget:
    """The MLflow client of one tracking URI. A server that does not answer fails a call after
    ``MLFLOW_HTTP_REQUEST_TIMEOUT`` seconds (default here 5) without MLflow's own retries: the caller retries."""

    def __init__(self, uri: str) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
        for chatty in ("mlflow.store.db.utils", "alembic"):  # database set-up lines, not the run's business
            logging.getLogger(chatty).setLevel(logging.WARNING)
        try:
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise TrackingUnavailable(NEEDS_MLFLOW) from None
        self.uri = uri
        self.client = MlflowClient(tracking_uri=uri)

    def create_run(self, identity: RunIdentity) -> str:
        """A new run in the identity's experiment (created if missing); returns its id."""
        experiment = self.client.get_experiment_by_name(identity.experiment_name)
        if experiment is None:
            experiment_id = self.client.create_experiment(
                identity.experiment_name, artifact_location=local_artifact_root(self.uri)
            )
        else:
            experiment_id = experiment.experiment_id
        run = self.client.create_run(
            experiment_id, start_time=identity.start_time_ms, tags=identity.tags, run_name=identity.run_name
        )
        return run.info.run_id

    def send(self, run_id: str, events: list[dict[str, Any]], run_dir: Path) -> None:
        """Send ``events`` in order: consecutive parameters, metrics and tags in batches; artifacts and status
        changes where they stand. Sending an event twice changes nothing on the server."""
        batch = _Batch()
        for event in events:
            if "artifact" in event or "status" in event:
                batch.flush(self.client, run_id)
                self._send_one(run_id, event, run_dir)
            else:
                batch.add(event, self.client, run_id)
        batch.flush(self.client, run_id)

    def _send_one(self, run_id: str, event: dict[str, Any], run_dir: Path) -> None:
        if "artifact" in event:
            path = run_dir / event["artifact"]
            if path.is_file():  # a file deleted since is skipped: the run folder is the record
                self.client.log_artifact(run_id, str(path), event.get("artifact_path"))
        elif event["status"] == "RUNNING":
            self.client.update_run(run_id, status="RUNNING")
        else:
            self.client.set_terminated(run_id, status=event["status"], end_time=event["timestamp"])


class _Batch:
    """Parameters, metrics and tags collected for one ``log_batch`` call within MLflow's limits."""

    def __init__(self) -> None:
        self.metrics: list = []
        self.params: list = []
        self.tags: list = []

    def add(self, event: dict[str, Any], client: Any, run_id: str) -> None:
        from mlflow.entities import Metric, Param, RunTag

        self.metrics += [Metric(m["key"], m["value"], m["timestamp"], m["step"]) for m in event.get("metrics", [])]
        self.params += [Param(k, v) for k, v in event.get("params", {}).items()]
        self.tags += [RunTag(k, v) for k, v in event.get("tags", {}).items()]
        if len(self.metrics) >= MAX_METRICS or len(self.params) >= MAX_PARAMS or len(self.tags) >= MAX_TAGS:
            self.flush(client, run_id)

    def flush(self, client: Any, run_id: str) -> None:
        while self.metrics or self.params or self.tags:
            metrics, self.metrics = self.metrics[:MAX_METRICS], self.metrics[MAX_METRICS:]
            params, self.params = self.params[:MAX_PARAMS], self.params[MAX_PARAMS:]
            tags, self.tags = self.tags[:MAX_TAGS], self.tags[MAX_TAGS:]
            client.log_batch(run_id, metrics=metrics, params=params, tags=tags)

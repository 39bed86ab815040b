"""Bring one MLflow run up to date with a run record: what ``anemo-sync`` and the background sender both do."""

from __future__ import annotations

from dataclasses import dataclass

from anemo_like.tracking.mlflow_target import MlflowTarget
from anemo_like.tracking.record import RunRecord

EVENTS_PER_CALL = 500  # events sent between two saves of the sync state


@dataclass(frozen=True)
class SyncResult:
    uri: str
    run_id: str
    sent: int  # events sent by this call
    total: int  # events the server now holds


def sync(record: RunRecord, target: MlflowTarget) -> SyncResult:
    """Send the events ``target``'s server has not acknowledged, creating the MLflow run the first time. The count
    acknowledged is saved after every call, so an interrupted sync resumes where it stopped, and one repeated by
    a crash between sending and saving changes nothing (MLflow drops identical metrics; parameters, tags and
    artifacts are overwritten with the same values)."""
    state = record.sync_state(target.uri)
    run_id, done = state["run_id"], state["sent"]
    if run_id is None:
        run_id = target.create_run(record.identity())
        record.save_sync_state(target.uri, run_id=run_id, sent=done)
    pending = record.events(done)
    for start in range(0, len(pending), EVENTS_PER_CALL):
        part = pending[start : start + EVENTS_PER_CALL]
        target.send(run_id, part, record.run_dir)
        record.save_sync_state(target.uri, run_id=run_id, sent=done + start + len(part))
    return SyncResult(target.uri, run_id, len(pending), done + len(pending))

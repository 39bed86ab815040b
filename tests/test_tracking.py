"""Experiment tracking against a real MLflow server (sqlite backend, started on 127.0.0.1 by the test): what a run
logs, a server killed mid-run, ``anemo-sync`` afterwards and twice, and a resumed run continuing its MLflow run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL
from mlflow.tracking import MlflowClient
from mlflow_server import MlflowServer

from anemo_like.cli.sync import main as anemo_sync
from anemo_like.tracking.record import RunRecord
from anemo_like.tracking.tracker import flatten
from anemo_like.training.trainer import Trainer

STEPS = 20
ARTIFACTS = {"config.yaml", "validation.md", "metrics.jsonl", "loss_curve.png", "rmse_by_lead.png", "forecast_map.png"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield running
    running.kill()


def tracked_run(compose_run, run_dir: Path, uri: str, *overrides: str):
    config = compose_run(
        run_dir,
        [
            f"training.max_steps={STEPS}", "diagnostics.log_every_n_steps=5", "training.val_every_n_steps=10",
            "diagnostics.tracking.backend=mlflow", f"diagnostics.tracking.tracking_uri={uri}",
            "diagnostics.tracking.experiment_name=tests", "diagnostics.tracking.send_every_s=0.2", *overrides,
        ],
    )  # fmt: skip
    return config


def mlflow_run_id(run_dir: Path, uri: str) -> str:
    return RunRecord(run_dir).sync_state(uri)["run_id"]


def server_view(client: MlflowClient, run_id: str) -> dict:
    """Everything of a run the comparisons look at: status, params, tags, metric histories, artifact names."""
    run = client.get_run(run_id)
    histories = {
        key: sorted((m.step, m.value) for m in client.get_metric_history(run_id, key)) for key in run.data.metrics
    }
    return {
        "status": run.info.status,
        "params": run.data.params,
        "tags": {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")},
        "metrics": histories,
        "artifacts": {a.path for a in client.list_artifacts(run_id)},
    }


def losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["train_loss"] for r in records if "train_loss" in r}


class KillServer:
    """Step hook: at ``at_step``, once the server holds some of the run, kill it (SIGKILL, whole process group)."""

    def __init__(self, server: MlflowServer, run_dir: Path, at_step: int) -> None:
        self.server, self.run_dir, self.at_step = server, run_dir, at_step
        self.sent_before_kill = 0

    def step_started(self, index: int) -> None:
        if index != self.at_step:
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and RunRecord(self.run_dir).sync_state(self.server.uri)["sent"] == 0:
            time.sleep(0.1)
        self.sent_before_kill = RunRecord(self.run_dir).sync_state(self.server.uri)["sent"]
        self.server.kill()

    def close(self) -> None:
        pass


def test_a_run_logs_params_metrics_and_artifacts_the_client_reads_back(tmp_path, compose_run, server) -> None:
    run_dir = tmp_path / "online"
    config = tracked_run(compose_run, run_dir, server.uri, "+diagnostics.tracking.tags.project=unit")
    Trainer(config).fit()
    view = server_view(MlflowClient(server.uri), mlflow_run_id(run_dir, server.uri))
    assert view["status"] == "FINISHED"
    assert view["params"] == flatten(config.model_dump(mode="json"))
    assert view["params"]["training.max_steps"] == str(STEPS)
    assert view["tags"]["project"] == "unit" and view["tags"]["world_size"] == "1"
    assert {"anemo_like.version", "torch.version", "device"} <= set(view["tags"])
    assert view["metrics"]["train_loss"] == sorted(losses(run_dir).items())
    assert [step for step, _ in view["metrics"]["lr"]] == [5, 10, 15, 20]
    assert [step for step, _ in view["metrics"]["val_loss"]] == [10, 20]
    assert any(key.startswith("rmse_z_500") for key in view["metrics"])
    assert "peak_memory_mib" in view["metrics"] and "it_per_s" in view["metrics"]
    assert view["artifacts"] == ARTIFACTS


def test_a_server_killed_mid_run_then_anemo_sync_completes_the_same_run(tmp_path, compose_run, caplog, capfd) -> None:
    reference_dir, run_dir = tmp_path / "reference", tmp_path / "offline"
    reference = MlflowServer(tmp_path / "reference-server").start()
    try:
        Trainer(tracked_run(compose_run, reference_dir, reference.uri)).fit()
        online = server_view(MlflowClient(reference.uri), mlflow_run_id(reference_dir, reference.uri))
    finally:
        reference.kill()

    server = MlflowServer(tmp_path / "server").start()
    killer = KillServer(server, run_dir, at_step=8)
    with caplog.at_level(logging.WARNING, logger="anemo_like"):
        Trainer(tracked_run(compose_run, run_dir, server.uri)).fit(hooks=[killer])
    assert killer.sent_before_kill > 0  # the server held part of the run when it died
    assert losses(run_dir) == losses(reference_dir)  # training went on unchanged
    sender_log = capfd.readouterr().err  # the sender process writes to the training's stderr
    assert sender_log.count("did not accept the run's events") == 1, sender_log  # one line, however many tries
    assert any("anemo-sync" in r.getMessage() and "not on" in r.getMessage() for r in caplog.records)

    restarted = MlflowServer(server.folder, port=server.port).start()
    try:
        anemo_sync([str(run_dir)])
        assert "event(s) sent" in capfd.readouterr().out
        client = MlflowClient(restarted.uri)
        synced = server_view(client, mlflow_run_id(run_dir, restarted.uri))
        assert synced["metrics"].keys() == online["metrics"].keys()
        for key in ("train_loss", "lr", "val_loss", "rollout"):
            assert synced["metrics"][key] == online["metrics"][key], key
        assert synced["status"] == online["status"] == "FINISHED"
        assert synced["artifacts"] == online["artifacts"] == ARTIFACTS
        changed = {k for k in online["params"] if synced["params"].get(k) != online["params"][k]}
        assert changed <= {"system.paths.output", "diagnostics.tracking.tracking_uri"}
        anemo_sync([str(run_dir)])  # twice: nothing new
        assert "already up to date" in capfd.readouterr().out
        assert server_view(client, mlflow_run_id(run_dir, restarted.uri)) == synced
        assert len(client.search_runs([client.get_experiment_by_name("tests").experiment_id])) == 1
    finally:
        restarted.kill()


def test_resume_continues_the_same_mlflow_run(tmp_path, compose_run, server) -> None:
    run_dir = tmp_path / "resumed"
    Trainer(tracked_run(compose_run, run_dir, server.uri, "training.max_steps=10")).fit()
    first_id = mlflow_run_id(run_dir, server.uri)
    Trainer(tracked_run(compose_run, run_dir, server.uri, "training.resume=auto")).fit()
    assert mlflow_run_id(run_dir, server.uri) == first_id
    view = server_view(MlflowClient(server.uri), first_id)
    assert [step for step, _ in view["metrics"]["train_loss"]] == [5, 10, 15, 20]  # each step once
    assert view["status"] == "FINISHED"
    assert "config-resumed-at-step-10.yaml" in view["artifacts"]


def test_anemo_sync_refuses_a_folder_without_a_record(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        anemo_sync([str(tmp_path)])
    assert stop.value.code == 2
    assert f"{tmp_path} holds no tracking record" in capsys.readouterr().err


def test_anemo_train_tracks_through_the_sender_it_starts_first(tmp_path, cache_dir, server) -> None:
    """The command starts the sender before importing torch; the run reaches the server complete."""
    run_dir = tmp_path / "cli"
    command = [
        str(Path(sys.executable).with_name("anemo-train")), "--config-name=quickstart", *TINY_MODEL,
        "training.max_steps=4", "diagnostics.plots=false", "diagnostics.tracking.backend=mlflow",
        f"diagnostics.tracking.tracking_uri={server.uri}", "diagnostics.tracking.experiment_name=cli",
        f"system.paths.cache={cache_dir}", f"hydra.run.dir={run_dir}",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    view = server_view(MlflowClient(server.uri), mlflow_run_id(run_dir, server.uri))
    assert view["status"] == "FINISHED"
    assert view["metrics"]["train_loss"] == sorted(losses(run_dir).items())
    assert {"config.yaml", "validation.md", "metrics.jsonl"} <= view["artifacts"]

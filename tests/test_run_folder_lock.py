"""A run folder is claimed by one run (docs/errors.md, "Runs, signals and disks"): an OS lock on ``.run.lock``
taken before the "already holds a run" check, held for the run's life and gone with its process; a refused run
leaves the earlier run's folder byte-identical, Hydra's record included. Real processes, real signals."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_MODEL
from test_data_parallel import launch, wait_all

from anemo_like.training.run_folder import claim_run_folder

FORK = multiprocessing.get_context("fork")
RUN = [*TINY_MODEL, "system.hardware.num_threads=1", "training.val_every_n_steps=1000", "diagnostics.plots=false"]
HOST = socket.gethostname()


def in_use(run_dir: Path, holder: str) -> str:
    return (
        f"system.paths.output {run_dir} is in use by a run still running ({holder}): wait for it to end, or choose "
        "another folder (system.paths.output=...)"
    )


def train(run_dir: Path, cache_dir: Path, *overrides: str) -> subprocess.Popen:
    """anemo-train into ``run_dir`` as a user runs it: Hydra's folder is the run folder."""
    command = [
        sys.executable, "-m", "anemo_like.cli.train", *RUN, f"system.paths.cache={cache_dir}",
        f"hydra.run.dir={run_dir}", *overrides,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(process: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    output, _ = process.communicate(timeout=timeout)
    assert "Traceback" not in output, output[-3000:]
    return process.returncode, output


def error_lines(output: str) -> list[str]:
    return [line.split("[ERROR] - ", 1)[1] for line in output.splitlines() if "[ERROR] - " in line]


def folder_hashes(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden ones included) and the SHA-256 of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# ------------------------------------------------------------------------------ the claim, many processes at once
def _claim_at_once(run_dir: Path, start, done, results) -> None:
    start.wait()
    try:
        claim_run_folder(run_dir, resume=None)
        results.put(("claimed", os.getpid()))
    except ValueError as exc:
        results.put(("refused", str(exc)))
    done.wait()  # the claim is held until every process has tried


@pytest.mark.parametrize("processes", [2, 4])
def test_processes_claiming_one_folder_at_once_let_exactly_one_in(tmp_path, processes) -> None:
    for attempt in range(20):
        run_dir = tmp_path / f"run-{attempt}"
        start, done, results = FORK.Barrier(processes), FORK.Barrier(processes), FORK.Queue()
        workers = [FORK.Process(target=_claim_at_once, args=(run_dir, start, done, results)) for _ in range(processes)]
        for worker in workers:
            worker.start()
        outcomes = [results.get(timeout=60) for _ in workers]
        for worker in workers:
            worker.join(timeout=60)
            assert worker.exitcode == 0
        [(_, winner)] = [o for o in outcomes if o[0] == "claimed"]
        refusals = [message for kind, message in outcomes if kind == "refused"]
        assert len(refusals) == processes - 1, outcomes
        allowed = {in_use(run_dir, f"process {winner} on {HOST}"), in_use(run_dir, "a process starting")}
        assert set(refusals) <= allowed, refusals
        assert sorted(p.name for p in run_dir.iterdir()) == [".run.lock"]


def _hold_with_a_forked_child(run_dir: Path, results) -> None:
    claim_run_folder(run_dir, resume=None)
    child = FORK.Process(target=time.sleep, args=(60,))  # a loader worker, forked while the claim is held
    child.start()
    results.put(child.pid)
    time.sleep(60)


def test_a_killed_run_leaves_no_claim_even_while_its_forked_children_live(tmp_path) -> None:
    run_dir = tmp_path / "run"
    results = FORK.Queue()
    holder = FORK.Process(target=_hold_with_a_forked_child, args=(run_dir, results))
    holder.start()
    child = results.get(timeout=60)
    try:
        with pytest.raises(ValueError) as refused:
            claim_run_folder(run_dir, resume=None)
        assert str(refused.value) == in_use(run_dir, f"process {holder.pid} on {HOST}")
        os.kill(holder.pid, signal.SIGKILL)
        while holder.exitcode is None:  # not join(): the child holds its end of the pipe join waits on
            time.sleep(0.01)
        os.kill(child, 0)  # still alive
        claim = claim_run_folder(run_dir, resume=None)
        assert (run_dir / ".run.lock").read_text() == f"process {os.getpid()} on {HOST}\n"
        claim.release()
        claim_run_folder(run_dir, resume=None).release()  # released: free again
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_folder_that_cannot_be_locked_is_one_line(tmp_path) -> None:
    (tmp_path / ".run.lock").mkdir()
    with pytest.raises(ValueError) as refused:
        claim_run_folder(tmp_path, resume=None)
    assert str(refused.value) == (
        f"system.paths.output {tmp_path} cannot be locked (Is a directory): .run.lock must be a file you can write, "
        "on a file system with file locks; choose another folder (system.paths.output=...)"
    )


# ---------------------------------------------------------------------------------------- real anemo-train runs
def test_two_runs_started_at_once_into_one_folder_train_once(tmp_path, cache_dir) -> None:
    run_dir = tmp_path / "run"
    started = [train(run_dir, cache_dir, "training.max_steps=2") for _ in range(2)]
    results = sorted(finish(process) for process in started)
    assert [code for code, _ in results] == [0, 2], [output[-2000:] for _, output in results]
    [refusal] = error_lines(results[1][1])
    # the run still running is named as such, also once it has written its first files
    assert refusal.startswith(f"system.paths.output {run_dir} is in use by a run still running (process ")
    assert refusal.endswith("(system.paths.output=...)")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [line for line in lines if '"train_loss"' in line]
    assert len(steps) == 2, lines
    assert "[ERROR]" not in (run_dir / "hydra_entry.log").read_text()


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory, cache_dir) -> Path:
    """A finished 1-step run whose folder is also Hydra's: checkpoints, metrics, .hydra/ and the log file."""
    run_dir = tmp_path_factory.mktemp("earlier") / "run"
    code, output = finish(train(run_dir, cache_dir, "training.max_steps=1"))
    assert code == 0, output[-3000:]
    return run_dir


def test_an_allowed_run_keeps_hydras_record_and_its_whole_log(earlier_run) -> None:
    hydra = earlier_run / ".hydra"
    assert sorted(p.name for p in hydra.iterdir()) == ["config.yaml", "hydra.yaml", "overrides.yaml"]
    assert "- training.max_steps=1" in (hydra / "overrides.yaml").read_text().splitlines()
    assert "max_steps: 1" in (hydra / "config.yaml").read_text()
    log = (earlier_run / "hydra_entry.log").read_text()
    assert "][anemo_like.data.setup][INFO] - data " in log and "outputs in " in log
    assert (earlier_run / ".run.lock").read_text().startswith("process ")


def test_a_refused_run_leaves_the_earlier_runs_folder_byte_identical(tmp_path, cache_dir, earlier_run) -> None:
    holds, running = tmp_path / "holds", tmp_path / "running"
    for copy in (holds, running):
        shutil.copytree(earlier_run, copy)
    claim = claim_run_folder(running, resume="auto")  # a run still running in the folder
    before = {copy: folder_hashes(copy) for copy in (holds, running)}
    assert {".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", "hydra_entry.log"} <= set(before[holds])
    try:
        new = train(holds, cache_dir, "training.max_steps=2")
        resumed = train(running, cache_dir, "training.resume=auto")
        (code, output), (resumed_code, resumed_output) = finish(new), finish(resumed)
    finally:
        claim.release()
    assert code == 2 and error_lines(output) == [
        f"system.paths.output {holds} already holds a run (checkpoints/last.pt, checkpoints/step-000000001.pt, "
        "inference.pt, metrics.jsonl): set training.resume=auto to continue it, or choose another folder "
        "(system.paths.output=...)"
    ], output[-3000:]
    assert resumed_code == 2, resumed_output[-3000:]
    assert error_lines(resumed_output) == [in_use(running, f"process {os.getpid()} on {HOST}")]
    for copy in (holds, running):
        assert folder_hashes(copy) == before[copy], f"{copy.name}: the earlier run's folder changed"


def test_a_multi_rank_run_is_claimed_once_by_rank_zero(tmp_path, cache_dir) -> None:
    run_dir = tmp_path / "run"
    processes = launch(run_dir, cache_dir, ["training.max_steps=2", "dataloader.batch_size.train=1"], world=2)
    for code, output in wait_all(processes, 240):
        assert code == 0, output[-3000:]  # a second rank locking the folder would have been refused
    assert (run_dir / ".run.lock").read_text() == f"process {processes[0].pid} on {HOST}\n"


def test_a_run_that_failed_before_its_first_record_leaves_a_folder_a_rerun_may_use(tmp_path) -> None:
    """An empty metrics.jsonl (a run stopped before its first step) is no run to protect; a record is."""
    (tmp_path / "metrics.jsonl").touch()
    claim_run_folder(tmp_path, resume=None).release()
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train_loss": 1.0}\n')
    with pytest.raises(ValueError, match=r"already holds a run \(metrics.jsonl\)"):
        claim_run_folder(tmp_path, resume=None)

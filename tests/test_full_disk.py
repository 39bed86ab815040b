"""A full disk (docs/errors.md, "Runs, signals and disks"): a training run and anemo-infer on a real full file
system (a tmpfs in a user namespace, where the machine allows one) stop with one message, leave no temporary file
and keep the previous checkpoint or forecast; stale copies a killed run left are removed at the next start."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from bad_input_helpers import TINY_DATA, tiny_dataset
from test_reliability import RUN, error_line, finish, writer_end_once_read

from anemo_like.atomic_io import DiskFull, disk_full
from anemo_like.checkpoints.training import load_training_checkpoint
from anemo_like.training.trainer import Trainer


def test_only_a_full_disk_becomes_disk_full(tmp_path) -> None:
    with open("/dev/full", "wb", buffering=0) as device, pytest.raises(OSError) as written:  # writes: ENOSPC
        device.write(b"x")
    full = disk_full(written.value, tmp_path / "x.pt", setting="output")
    assert isinstance(full, DiskFull) and full.errno == errno.ENOSPC
    assert str(full) == (
        f"no space left on the device holding {tmp_path / 'x.pt'} (No space left on device): free space there or "
        "choose another folder (output=...); nothing was written"
    )
    denied = OSError(errno.EACCES, "Permission denied")
    assert disk_full(denied, tmp_path / "x.pt", setting="output") is denied


def tmpfs_available() -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return shutil.which("unshare") is not None and probe.returncode == 0


def on_small_disk(folder: Path, size: str, command: list[str]) -> str:
    """Run ``command`` with a tmpfs of ``size`` mounted on ``folder`` (in a user and mount namespace); it must fail
    with status 1 and one message, which is returned."""
    script = f"mount -t tmpfs -o size={size} tmpfs {folder} && exec " + " ".join(f"'{c}'" for c in command)
    process = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=240)
    output = process.stdout + process.stderr
    assert process.returncode == 1 and "Traceback" not in output, output[-3000:]
    return error_line(output)


@pytest.mark.skipif(not tmpfs_available(), reason="needs user namespaces to mount a small tmpfs")
def test_training_on_a_full_file_system(tmp_path, cache_dir) -> None:
    full = tmp_path / "small-disk"
    full.mkdir()
    command = [sys.executable, "-m", "anemo_like.cli.train", *RUN, "training.max_steps=2",
               f"system.paths.output={full / 'run'}", f"system.paths.cache={cache_dir}",
               f"hydra.run.dir={tmp_path / 'hydra'}"]  # fmt: skip
    assert on_small_disk(full, "48k", command) == (
        f"anemo-train failed: DiskFull: no space left on the device holding {full / 'run' / 'checkpoints'}"
        "/step-000000002.pt (No space left on device): free space there or choose another folder "
        "(system.paths.output=...); nothing was written"
    )


def test_anemo_infer_full_disk_and_signals_while_forecasting(tmp_path, compose_run) -> None:
    """A 1-step model of the tiny dataset; forecasts whose input chunk is a FIFO block in the forecast phase."""
    dataset = tiny_dataset(tmp_path / "tiny.zarr")
    Trainer(compose_run(tmp_path / "run", [f"data.dataset={dataset}", *TINY_DATA, "training.max_steps=1"])).fit()
    infer = [sys.executable, "-m", "anemo_like.cli.infer", f"checkpoint={tmp_path / 'run' / 'inference.pt'}",
             "dates=[2000-01-04T00]", "lead_time=6h", "verify=false"]  # fmt: skip
    full = tmp_path / "small-disk"
    full.mkdir()
    blocked = tmp_path / "blocked.zarr"
    shutil.copytree(dataset, blocked)
    chunk = blocked / "data" / "12.0.0.0"  # 2000-01-04T00, read when the forecasts start
    chunk.unlink()
    os.mkfifo(chunk)
    forecasting = subprocess.Popen(
        [*infer, f"dataset={blocked}", f"output={tmp_path / 'forecast.zarr'}", f"hydra.run.dir={tmp_path / 'h1'}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    writer = writer_end_once_read(chunk)
    forecasting.send_signal(signal.SIGTERM)
    try:
        code, output = finish(forecasting)
    finally:
        os.close(writer)
    assert code == 143, output[-3000:]
    assert output.strip().splitlines()[-1] == (
        "anemo-infer: received SIGTERM during the forecasts: stopped before the work was saved; exiting with status 143"
    )
    assert not (tmp_path / "forecast.zarr").exists() and not list(tmp_path.glob(".forecast.zarr.tmp-*"))
    if not tmpfs_available():
        return
    command = [*infer, f"dataset={dataset}", f"output={full / 'f.zarr'}", f"hydra.run.dir={tmp_path / 'h2'}"]
    assert on_small_disk(full, "8k", command) == (
        f"anemo-infer failed: DiskFull: no space left on the device holding {full / 'f.zarr'} (No space left on "
        "device): free space there or choose another folder (output=...); nothing was written"
    )


def test_stale_forecast_copies_are_removed_and_weights_are_checked_before_a_checkpoint(tmp_path, compose_run):
    from anemo_like.inference.output import check_output
    from anemo_like.training.nonfinite import TrainingDiverged

    stale = [tmp_path / ".forecast.zarr.tmp-1a2b3c4d", tmp_path / ".forecast.zarr.tmp-5e6f7a8b"]
    stale[0].mkdir()
    stale[1].write_bytes(b"half")
    keep = tmp_path / ".other.zarr.tmp-1a2b3c4d"  # another output's copy: maybe being written now
    keep.mkdir()
    check_output(tmp_path / "forecast.zarr")
    assert not any(p.exists() for p in stale) and keep.exists()

    trainer = Trainer(compose_run(tmp_path / "run", ["training.max_steps=3", "training.checkpoint_every_n_steps=1"]))
    trainer.fit()
    name, weight = next((k, v) for k, v in trainer.model.named_parameters() if v.dim() == 2)
    with torch.no_grad():
        weight[0, :2] = float("inf")
    with pytest.raises(TrainingDiverged) as diverged:
        trainer.checkpoints.save(trainer.step)
    assert str(diverged.value) == (
        f"training diverged: after step 3 the weights hold NaN or inf ({name}: 2 values), so no checkpoint was "
        f"written; the last checkpoint, {tmp_path / 'run' / 'checkpoints' / 'last.pt'} (step 3), holds finite "
        "weights: resume from it (training.resume=auto) with a lower training.optimizer.lr"
    )
    assert torch.isfinite(load_training_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"][name]).all()


def test_a_failed_zarr_forecast_write_leaves_no_write_running(tmp_path, monkeypatch, caplog) -> None:
    """One chunk write fails with a full disk while another is still writing: the second must end (and its error
    be taken) before the temporary copy is removed, so nothing fails late and asyncio logs no traceback."""
    import asyncio
    import gc

    import numpy as np
    import xarray as xr
    import zarr.storage

    from anemo_like.inference.output import write_forecast

    original = zarr.storage.LocalStore._set

    async def full_disk_for_a(self, key, value, exclusive=False):
        if key.startswith("a/"):
            raise OSError(errno.ENOSPC, "No space left on device")
        if key.startswith("b/") and not key.endswith((".zarray", ".zattrs")):
            await asyncio.sleep(0.2)  # still writing when a's write has failed
        return await original(self, key, value, exclusive)

    monkeypatch.setattr(zarr.storage.LocalStore, "_set", full_disk_for_a)
    dataset = xr.Dataset({name: ("values", np.arange(4.0)) for name in ("a", "b")})
    with pytest.raises(DiskFull):
        write_forecast(dataset, tmp_path / "forecast.zarr")
    time.sleep(0.4)
    gc.collect()
    assert list(tmp_path.iterdir()) == []
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text

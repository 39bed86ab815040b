"""A training run's experiment tracking (``diagnostics.tracking``): rank 0 opens the tracker, the metrics log feeds
it, and the run's end records its status and outputs."""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import torch
import yaml

from anemo_like.interrupts import Interrupted
from anemo_like.tracking.tracker import Tracker
from anemo_like.training.outputs import RunOutputs
from anemo_like.training.preemption import Preempted
from anemo_like.training.setup import Run

LOG = logging.getLogger(__name__)
PLOTS = ("loss_curve.png", "rmse_by_lead.png", "forecast_map.png")


def open_tracker(run: Run, *, step: int) -> Tracker | None:
    """The run's tracker (rank 0, ``diagnostics.tracking.backend`` not ``none``), its parameters, tags and resolved
    config recorded as training starts at ``step``; None when the run is not tracked."""
    tracker, config = run.tracker, run.config.diagnostics.tracking
    if tracker is None:
        return None
    resolved = run.config.model_dump(mode="json")
    tracker.start(params=resolved, tags=system_tags(run), config_yaml=yaml.safe_dump(resolved), step=step)
    LOG.info(
        "tracking: MLflow run %s of experiment %s at %s (recorded in %s first)",
        tracker.record.identity().run_name, config.experiment_name, tracker.uri, tracker.record.folder,
    )  # fmt: skip
    return tracker


def system_tags(run: Run) -> dict[str, str]:
    """Package and library versions, the source's git commit where there is one, device and world size."""
    tags = {
        "anemo_like.version": importlib.metadata.version("anemo-like"),
        "torch.version": torch.__version__,
        "torch.cuda": str(torch.version.cuda),
        "device": str(run.placement.device),
        "world_size": str(run.placement.launch.world_size),
    }
    commit = _git_commit(Path(__file__).resolve().parent)
    if commit is not None:
        tags["mlflow.source.git.commit"] = commit
    return tags


def _git_commit(folder: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def log_outputs(tracker: Tracker | None, outputs: RunOutputs | None, *, log_model: bool) -> None:
    """The run's outputs as artifacts: validation table, metrics file, plots, and ``inference.pt`` if asked
    (nothing without a tracker, or on ranks that write no outputs)."""
    if tracker is None or outputs is None:
        return
    folder = outputs.run_dir
    for name in ("validation.md", "metrics.jsonl", *PLOTS):
        if (folder / name).is_file():
            tracker.log_artifact(folder / name)
    if log_model:
        tracker.log_artifact(outputs.inference_checkpoint)


@contextlib.contextmanager
def tracked(tracker: Tracker | None) -> Iterator[None]:
    """Record how the block ends: ``FINISHED``, ``KILLED`` (preempted or interrupted: a resume continues the same
    run) or ``FAILED``."""
    if tracker is None:
        yield
        return
    try:
        yield
    except (Preempted, Interrupted, KeyboardInterrupt):
        tracker.finish("KILLED")
        raise
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish("FINISHED")

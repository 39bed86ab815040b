"""The checkpoints of one training run: where they go, resuming from one, writing one for a step (never with
non-finite weights) and what to advise when the run diverges."""

from __future__ import annotations

import logging
import time
import uuid

from anemo_like.checkpoints.finite import first_nonfinite
from anemo_like.checkpoints.locate import CHECKPOINTS_FOLDER, LATEST
from anemo_like.checkpoints.training import read_resume_state, resume_path, save_training_checkpoint, set_rng_state
from anemo_like.training.nonfinite import TrainingDiverged
from anemo_like.training.setup import Run

LOG = logging.getLogger(__name__)


class RunCheckpoints:
    """A run's training checkpoints in ``<run folder>/checkpoints``; ``saved_step`` is the newest one's step,
    ``run_id`` names this run's checkpoints (pruning deletes only those)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.path = run.placement.run_dir / CHECKPOINTS_FOLDER / LATEST
        self.saved_step: int | None = None
        self.saved_at = time.perf_counter()  # when the last one was written (training.checkpoint_every_minutes)
        self.run_id = uuid.uuid4().hex

    def resume(self) -> int:
        """Load the checkpoint ``training.resume`` names into the model, optimiser, weight average and RNGs; the
        step to continue from (0 when there is nothing to resume)."""
        run = self.run
        path = resume_path(run.config.training.resume, self.path.parent)
        if path is None:
            return 0
        state = read_resume_state(path, config=run.config.model_dump(mode="json"), graph_hash=run.graph_hash)
        run.model.load_state_dict(state["model"])
        run.optimizer.load_state_dict(state["optimizer"])
        average = run.weight_average
        if average is not None and "weight_average" in state:
            average.load_state_dict(state["weight_average"])
        elif average is not None:
            LOG.info("training.ema: %s holds no weight average; the average starts from its weights", path)
            average.reset()
        set_rng_state(state["rng"])
        self.saved_step = int(state["step"])
        if state.get("run_id") and path.resolve().is_relative_to(run.placement.run_dir.resolve()):
            self.run_id = state["run_id"]  # continuing this folder's run
        LOG.info("resumed from %s at step %d", path, self.saved_step)
        return self.saved_step

    def save(self, step: int) -> None:
        """Write ``step``'s checkpoint (rank 0; every rank checks the weights first, so all stop together if a
        diverged run left them non-finite: a checkpoint never holds NaN or inf)."""
        run = self.run
        found = first_nonfinite(run.model.state_dict())
        if found is not None:
            raise TrainingDiverged(
                f"training diverged: after step {step} the weights hold NaN or inf ({found[0]}: {found[1]} "
                f"values), so no checkpoint was written; {self.advice()}"
            )
        if run.placement.is_main:
            save_training_checkpoint(
                self.path.parent,
                model=run.model,
                optimizer=run.optimizer,
                step=step,
                config_json=run.config.model_dump_json(),
                graph_hash=run.graph_hash,
                keep_last=run.config.training.checkpoint_keep_last,
                run_id=self.run_id,
                weight_average=None if run.weight_average is None else run.weight_average.state_dict(),
            )
        self.saved_at = time.perf_counter()
        self.saved_step = step

    def due_by_time(self, now: float) -> bool:
        """Whether ``training.checkpoint_every_minutes`` have passed since the last checkpoint (or since
        :meth:`restart_clock`) at ``now`` (``time.perf_counter`` seconds)."""
        every_minutes = self.run.config.training.checkpoint_every_minutes
        return every_minutes is not None and now - self.saved_at > 60 * every_minutes

    def restart_clock(self) -> None:
        """Count the minutes to the next timed checkpoint from now (the loop starts after set-up and resuming)."""
        self.saved_at = time.perf_counter()

    def advice(self) -> str:
        """What a diverged run can do next: resume from the last (finite) checkpoint, or start again."""
        if self.saved_step is None:
            return "no checkpoint was written before: start again with a lower training.optimizer.lr"
        return (
            f"the last checkpoint, {self.path} (step {self.saved_step}), holds finite weights: resume from "
            "it (training.resume=auto) with a lower training.optimizer.lr"
        )

    def saved_for_resume(self, step: int) -> str | None:
        """What a stop signal leaves when ``step`` is checkpointed (the outputs are then written by resuming)."""
        if self.saved_step != step:
            return None
        return f"checkpoint {self.path} holds step {step}; training.resume=auto writes the rest"

"""The training loop in plain PyTorch: AdamW, warm-up + cosine LR, clipping, rollout loss, validation, checkpoints.

:func:`~anemo_like.training.setup.build_run` builds the parts; :class:`Trainer` runs the loop, calling its hooks
(memory snapshots, profiling) at every step, and resumes and checkpoints through
:class:`~anemo_like.training.run_checkpoints.RunCheckpoints`. The hot path never waits for the device: the loss is
summed on the device and read every ``diagnostics.log_every_n_steps``; stop decisions travel on a CPU group
(:class:`StopVote`). A step whose loss or gradient norm is not finite is skipped on the device, and
``training.max_nonfinite_steps`` of them in a row stop the run (:mod:`~anemo_like.training.nonfinite`).
"""

from __future__ import annotations

import logging
import time

import torch

from anemo_like.config.schema import RunConfig
from anemo_like.data.setup import LoaderOptions
from anemo_like.diagnostics.phases import PhaseClock
from anemo_like.distributed.data_parallel import barrier, mean_over_ranks
from anemo_like.distributed.stop_vote import StopVote
from anemo_like.interrupts import acting_on_stop, phase, stop_requests
from anemo_like.models.ops.collectives import gather_nodes
from anemo_like.progress import Progress
from anemo_like.runtime.process_memory import peak_memory_mib
from anemo_like.scoring.score_areas import score_areas
from anemo_like.tracking.background import SenderProcess
from anemo_like.training.cuda_graphs import CapturedStep
from anemo_like.training.ema import averaged_weights
from anemo_like.training.ensemble import rollout_loss
from anemo_like.training.hooks import StepHook, default_hooks
from anemo_like.training.metrics import LossWindow, MetricsLog
from anemo_like.training.nonfinite import NonFiniteSteps, TrainingDiverged, gradient_norm, step_is_finite
from anemo_like.training.optimizer import set_learning_rate, step_unless
from anemo_like.training.outputs import RunOutputs, forecast_sample, write_run_outputs
from anemo_like.training.preemption import Preempted
from anemo_like.training.run_checkpoints import RunCheckpoints
from anemo_like.training.schedule import learning_rate, rollout_steps
from anemo_like.training.setup import build_run, log_run
from anemo_like.training.tracking import log_outputs, open_tracker, tracked
from anemo_like.training.validation import Scoring, ValidationResult, validate

LOG = logging.getLogger(__name__)


class Trainer:
    """A training run: the parts from :func:`build_run`, resumed from ``training.resume`` when set."""

    def __init__(self, config: RunConfig, *, tracking_sender: SenderProcess | None = None) -> None:
        self.run = run = build_run(config, tracking_sender=tracking_sender)
        self.config, self.model, self.optimizer = run.config, run.model, run.optimizer
        self.device, self.run_dir, self.groups = run.placement.device, run.placement.run_dir, run.placement.groups
        self.is_main, self.validates = run.placement.is_main, run.placement.validates
        self.data, self.graph, self.graph_hash, self.precision = run.data, run.graph, run.graph_hash, run.precision
        self.gradients, self.average = run.parallel.gradients, run.weight_average
        self.normalize_batch = self.data.device_normalizer(self.device)
        self.val_loader = self.data.val_loader(self.loader_options("val"))  # built once: workers may persist
        self.eager_steps = 0
        self.captured: CapturedStep | None = None  # training.cuda_graphs: the captured step, once warmed up
        self.clock = PhaseClock(self.device)  # records only while anemo-profile turns it on
        self.nonfinite = NonFiniteSteps(self.device, limit=self.config.training.max_nonfinite_steps)
        self.checkpoints = RunCheckpoints(run)
        self.step = self.checkpoints.resume()  # training.resume: 0 for a new run
        log_run(run)

    # -------------------------------------------------------------------------------------------- step
    def loader_options(self, split: str) -> LoaderOptions:
        return LoaderOptions.for_split(self.config.dataloader, split, self.device)

    def train_loader(self, start_sample: int) -> torch.utils.data.DataLoader:
        """This rank's training batches from global sample position ``start_sample`` (its grid slice when the
        reader group splits the grid)."""
        groups = self.groups
        return self.data.train_loader(
            self.loader_options("train"),
            seed=self.config.training.seed,
            start_sample=start_sample,
            rank=groups.dp_rank,
            world_size=groups.dp_size,
            grid=self.run.grid_bounds[groups.reader_rank] if groups.reader_size > 1 else None,
            limit_batches=self.config.dataloader.limit_batches.train,
        )

    def prepare_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """A loader batch of the whole grid made ready for the model: on the device, normalised (with
        ``dataloader.normalize_on_device``) and in the weights' dtype."""
        batch = batch.to(self.device, non_blocking=True)
        if self.normalize_batch is not None:
            batch = self.normalize_batch(batch)
        return batch.to(self.precision.param_dtype)

    def prepare_train_batch(self, batch: torch.Tensor) -> torch.Tensor:
        """:meth:`prepare_batch` for a training batch of this rank's grid slice: the reader group's slices are
        gathered first."""
        batch = batch.to(self.device, non_blocking=True)
        sizes = [stop - start for start, stop in self.run.grid_bounds]
        return self.prepare_batch(gather_nodes(batch, self.groups.reader_group, sizes, dim=2))

    def train_step(self, batch: torch.Tensor) -> torch.Tensor:
        """One optimiser step on a prepared batch; returns the loss (a device tensor, not read here). With
        ``training.cuda_graphs``, the step after ``cuda_graph_warmup`` eager ones is captured, later ones replay it."""
        cfg = self.config.training
        set_learning_rate(
            self.optimizer,
            self.run.lr_factor * learning_rate(self.step, config=cfg.optimizer, max_steps=cfg.max_steps),
        )
        if self.captured is not None:
            return self.captured(batch)
        if cfg.cuda_graphs and self.eager_steps == cfg.cuda_graph_warmup:
            started = time.perf_counter()
            self.captured = CapturedStep(self._forward_backward_update, batch, self.optimizer)
            LOG.info("captured the training step as a CUDA graph in %.1f s", time.perf_counter() - started)
            return self.captured.first_loss
        self.eager_steps += 1
        if self.gradients is None:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            self.gradients.zero()
        return self._forward_backward_update(batch)

    def _forward_backward_update(self, batch: torch.Tensor) -> torch.Tensor:
        """Rollout loss, backward, gradient averaging and clipping, optimiser step; gradients must be zero or None.
        A step whose loss or gradient norm is not finite is skipped and counted (:class:`NonFiniteSteps`). Free of
        host-device syncs with fused AdamW, so a CUDA graph can capture it."""
        cfg = self.config.training
        steps = rollout_steps(self.step, config=cfg.rollout)
        scaler = self.precision.scaler
        with self.precision.training_weights(self.model):  # cast once for forward, recomputation and backward
            with self.precision.autocast():
                loss = rollout_loss(
                    self.model, batch, spec=self.run.spec, loss_fn=self.run.loss_fn, steps=steps,
                    ensemble=self.run.ensemble, step=self.step, lead_weights=cfg.lead_loss_weights,
                )  # fmt: skip
            self.clock.switch("decoder backward")
            (loss if scaler is None else scaler.scale(loss)).backward()
        self.clock.switch("optimizer step")
        if self.gradients is not None:
            self.gradients.average()
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        if cfg.optimizer.gradient_clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(
                self.model.parameters(), cfg.optimizer.gradient_clip_norm, foreach=True
            )
        else:
            norm = gradient_norm(self.model.parameters())
        if scaler is None:
            bad = ~step_is_finite(loss, norm)
            step_unless(self.optimizer, bad)
        else:  # the scaler skips steps with inf gradients itself (and lowers its scale): count the loss only
            bad = ~step_is_finite(loss, None)
            scaler.step(self.optimizer)
            scaler.update()
        self.nonfinite.record(bad)
        if self.average is not None:
            self.average.update()
        return loss.detach()

    def validate(self) -> ValidationResult:
        """Score rollouts of the validation split (with the averaged weights when ``training.ema`` keeps them)."""
        with averaged_weights(self.average):
            return self._validate()

    def _validate(self) -> ValidationResult:
        data, cfg = self.data, self.config
        output_index = [data.roles.read.index(n) for n in data.roles.output]
        scoring = Scoring(
            output_names=data.roles.output,
            output_scale=data.normalizer.scale[output_index],
            area_weight=self.run.area_weight,
            step_length=data.store.frequency * data.stride,
            loss_fn=self.run.loss_fn,
            climatology=data.climatology,
            areas=score_areas(data.store),
        )
        return validate(
            self.model,
            self.val_loader,
            spec=self.run.spec,
            scoring=scoring,
            steps=cfg.training.val_rollout,
            device=self.device,
            limit_batches=cfg.dataloader.limit_batches.val,
            prepare=self.prepare_batch,
            autocast=self.precision.autocast,
            progress=cfg.diagnostics.progress_bar and self.is_main,
            members=cfg.training.ensemble.members,
            seed=cfg.training.seed,
            initial_members=data.val.initial_members,
        )

    # -------------------------------------------------------------------------------------------- loop
    def fit(self, hooks: list[StepHook] | None = None) -> RunOutputs | None:
        """Train to ``training.max_steps``; returns the outputs on rank 0 (None on other data-parallel ranks).
        ``hooks`` default to :func:`default_hooks`; each is closed on every exit path."""
        hooks = default_hooks(self.run) if hooks is None else hooks
        tracker = open_tracker(self.run, step=self.step)
        metrics = MetricsLog(
            self.run_dir / "metrics.jsonl", keep_until_step=self.step, write=self.is_main, tracker=tracker
        )
        started = time.perf_counter()
        end = "the end of the run (final validation and outputs)"
        with tracked(tracker), phase(end, saved=lambda: self.checkpoints.saved_for_resume(self.step)):
            outputs = self._fit(metrics, hooks, started)
            log_outputs(tracker, outputs, log_model=self.config.diagnostics.tracking.log_model)
            return outputs

    def _fit(self, metrics: MetricsLog, hooks: list[StepHook], started: float) -> RunOutputs | None:
        try:
            result = self._train(metrics, hooks, started)
        finally:
            for hook in hooks:
                hook.close()
        if self.validates and result is None:  # resumed at or past max_steps: score the checkpoint
            result = self.validate()
            if not metrics.has(self.step, "val_loss"):  # a resume of a finished run records it once
                metrics.write({"step": self.step, **result.as_record()})
        plots = self.validates and self.config.diagnostics.plots
        with averaged_weights(self.average):  # the plots and inference.pt show the averaged weights
            sample = forecast_sample(self.run, self.prepare_batch) if plots else None
            if not self.is_main:  # rank 0 writes the run's outputs
                return None
            seconds = time.perf_counter() - started
            return write_run_outputs(
                self.run, step=self.step, result=result, metrics=metrics, seconds=seconds, sample=sample,
                training_checkpoint=self.checkpoints.path,
            )  # fmt: skip

    def _train(self, metrics: MetricsLog, hooks: list[StepHook], started: float) -> ValidationResult | None:
        """The loop; returns the last validation (None when no step ran)."""
        cfg = self.config
        batches = iter(self.train_loader(self.step * cfg.dataloader.batch_size.train * self.groups.dp_size))
        stop_vote = StopVote()
        show, every = cfg.diagnostics.progress_bar and self.is_main, cfg.diagnostics.log_every_n_steps
        progress = Progress(cfg.training.max_steps, desc="training", initial=self.step, enabled=show, log_every=every)
        losses, result, first_step = LossWindow(self.device), None, self.step
        self.model.train()
        self.checkpoints.restart_clock()
        with stop_requests() as preemption:
            while self.step < cfg.training.max_steps:
                for hook in hooks:
                    hook.step_started(self.step - first_step)
                losses.add(self.train_step(self.prepare_train_batch(next(batches))))
                self.step += 1
                now = time.perf_counter()
                over_budget = cfg.training.max_minutes is not None and now - started > 60 * cfg.training.max_minutes
                # every rank stops at the same step: a signal or the budget on one rank stops them all
                last = self.step == cfg.training.max_steps
                due_log = self.step % cfg.diagnostics.log_every_n_steps == 0 or last
                diverging = due_log and self.nonfinite.reached() is not None
                preempted, out_of_time, diverged = stop_vote((preemption.received is not None, over_budget, diverging))
                if due_log or out_of_time or preempted or diverged:
                    self._log_losses(metrics, progress, losses)
                else:
                    progress.update_to(self.step)
                if last:  # with several ranks this step's vote is still posted: what it decides acts now
                    final = stop_vote.finish() or (False,) * 3
                    preempted, diverged = preempted or final[0], diverged or final[2]
                if diverged:
                    self._stop_diverged(progress, first_step)
                if preempted:
                    self._stop_preempted(stop_vote, progress, preemption.received)
                result = self._checkpoint_and_validate(metrics, now, last=last, out_of_time=out_of_time) or result
                if out_of_time:
                    minutes = cfg.training.max_minutes
                    LOG.info("training.max_minutes (%s) reached at step %d: stopping", minutes, self.step)
                    break
            stop_vote.finish()
        progress.close()
        return result

    def _log_losses(self, metrics: MetricsLog, progress: Progress, losses: LossWindow) -> None:
        record = {
            "step": self.step,
            "train_loss": float(mean_over_ranks(losses.total)) / losses.count,
            "lr": float(self.optimizer.param_groups[0]["lr"]),  # a tensor under CUDA graphs
            "rollout": rollout_steps(self.step - 1, config=self.config.training.rollout),
            "peak_memory_mib": peak_memory_mib(self.device),  # CUDA max allocated, or VmHWM on CPU
        }
        progress.update_to(self.step, loss=record["train_loss"], rollout=record["rollout"])
        metrics.write({**record, "it_per_s": progress.rate()})
        losses.reset()

    def _stop_diverged(self, progress: Progress, first_step: int) -> None:
        progress.close()
        limit = self.config.training.max_nonfinite_steps
        reached = self.nonfinite.reached()
        steps = (
            f"steps {first_step + reached - limit + 1} to {first_step + reached}"
            if reached is not None
            else f"consecutive steps on another rank before step {self.step}"
        )
        raise TrainingDiverged(
            f"training diverged: the loss or gradient norm was not finite in {steps} (training.max_nonfinite_steps="
            f"{limit}); those steps were skipped and training stopped at step {self.step}; " + self.checkpoints.advice()
        )

    def _stop_preempted(self, stop_vote: StopVote, progress: Progress, signal: str | None) -> None:
        acting_on_stop()  # a second signal from here on cannot change the status this logs
        stop_vote.finish()
        self.checkpoints.save(self.step)
        progress.close()
        LOG.warning(
            "received %s: stopped after step %d, checkpoint %s written; exiting with status 0 "
            "(training.resume=auto continues from it)",
            signal or "a stop signal on another rank",
            self.step,
            self.checkpoints.path,
        )
        raise Preempted

    def _checkpoint_and_validate(
        self, metrics: MetricsLog, now: float, *, last: bool, out_of_time: bool
    ) -> ValidationResult | None:
        """Checkpoint first (a validation that fails cannot lose the step's checkpoint), then validate, when the
        step is due for either; returns the validation, if one ran here."""
        training = self.config.training
        timed_save = self.checkpoints.due_by_time(now)
        if self.step % training.checkpoint_every_n_steps == 0 or last or out_of_time or timed_save:
            self.checkpoints.save(self.step)
        if not (self.step % training.val_every_n_steps == 0 or last or out_of_time):
            return None
        result = None
        if self.validates:
            result = self.validate()
            metrics.write({"step": self.step, **result.as_record()})
        barrier()
        return result

"""The training loop in plain PyTorch: AdamW, warm-up + cosine LR, clipping, rollout loss, validation, checkpoints.

The hot path never waits for the device: the loss is summed on the device and read every
``diagnostics.log_every_n_steps``; stop decisions travel on a CPU group (:class:`StopVote`).
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from anemo_like.config.schema import ModelConfig, RunConfig
from anemo_like.distributed.data_parallel import (
    GradientBuckets,
    barrier,
    mean_over_ranks,
    release_process_group,
)
from anemo_like.distributed.environment import (
    init_process_group,
    launch_environment,
    main_rank_first,
    rank_zero_value,
    select_device,
)
from anemo_like.distributed.groups import build_process_groups
from anemo_like.distributed.parallelize import parallelize
from anemo_like.distributed.primitives import gather_nodes, node_shard_bounds
from anemo_like.distributed.stop_vote import StopVote
from anemo_like.graphs import graph_fingerprint, load_or_build_graph
from anemo_like.inference.checkpoint import save_inference_checkpoint
from anemo_like.models.backends import check_backends
from anemo_like.models.compile import compile_modules
from anemo_like.models.forecast_model import ForecastModel
from anemo_like.models.heap_release import set_heap_release
from anemo_like.models.inference_chunks import check_inference_environment
from anemo_like.models.memory_model import (
    count_parameters,
    device_memory_bytes,
    has_auto_chunks,
    resolve_auto_chunks,
)
from anemo_like.profiling.memory import peak_rss_mib
from anemo_like.profiling.phases import PhaseClock
from anemo_like.profiling.snapshot import MemorySnapshotRecorder
from anemo_like.training.checkpoint import (
    check_checkpoint_versions,
    latest_checkpoint,
    load_training_checkpoint,
    resume_mismatches,
    save_training_checkpoint,
    set_rng_state,
)
from anemo_like.training.cuda_graphs import CapturedStep, cuda_graph_refusal
from anemo_like.training.data_setup import DataSetup, LoaderOptions, setup_data
from anemo_like.training.loss import WeightedMSE
from anemo_like.training.optimizer import build_adamw, set_learning_rate
from anemo_like.training.plots import plot_forecast_map, plot_loss_curve, plot_rmse_by_lead
from anemo_like.training.precision import precision_plan
from anemo_like.training.preemption import Preempted, PreemptionSignal
from anemo_like.training.progress import Progress
from anemo_like.training.rollout import rollout
from anemo_like.training.schedule import learning_rate, learning_rate_scale, rollout_steps
from anemo_like.training.validation import ValidationResult, validate

LOG = logging.getLogger(__name__)


@dataclass
class RunOutputs:
    """Where a run wrote its results, and its final validation."""

    run_dir: Path
    training_checkpoint: Path
    inference_checkpoint: Path
    metrics: Path
    validation: ValidationResult


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class MetricsLog:
    """Append-only JSON-lines metrics file; on resume, records after the resumed step are dropped."""

    def __init__(self, path: Path, *, keep_until_step: int, write: bool = True) -> None:
        self.path = path
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
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


class Trainer:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.run_dir = Path(config.system.paths.output).expanduser()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if config.system.hardware.num_threads:
            torch.set_num_threads(config.system.hardware.num_threads)
        seed_everything(config.training.seed)
        self.launch = launch_environment()
        self.is_main = self.launch.rank == 0
        self.device = select_device(config.system.hardware.accelerator, self.launch.local_rank)
        hardware = config.system.hardware
        if self.launch.distributed:
            init_process_group(self.launch, self.device, timeout_minutes=hardware.collective_timeout_minutes)
            self.run_dir = Path(rank_zero_value(str(self.run_dir), self.launch))  # one run folder for all ranks
        self.groups = build_process_groups(
            self.launch.world_size, self.launch.rank, hardware.num_gpus_per_model, config.dataloader.read_group_size
        )
        self.validates = self.groups.dp_rank == 0  # the ranks of model instance 0 validate; rank 0 writes
        with main_rank_first(self.launch):  # rank 0 generates the built-in dataset and caches the graph
            self.data: DataSetup = setup_data(config)
            cache = Path(config.system.paths.cache).expanduser() / "graphs" if config.graph.cache else None
            self.graph = load_or_build_graph(
                self.data.store.latitudes,
                self.data.store.longitudes,
                cache_dir=cache,
                mesh_resolution=config.graph.mesh_resolution,
                cutoff_factor=config.graph.cutoff_factor,
                knn=config.graph.knn,
                processor_edges=config.model.processor.type == "graphtransformer",
            )
        check_inference_environment()  # a bad ANEMOI_INFERENCE_* variable fails here, not mid-run
        if config.training.cuda_graphs:
            refusal = cuda_graph_refusal(config, self.device, self.launch.world_size)
            if refusal is not None:
                raise ValueError(f"training.cuda_graphs=true: {refusal}")
        self.precision = precision_plan(config.training.precision, self.device, cuda_graphs=config.training.cuda_graphs)
        check_backends(config.model, self.device, self.precision.autocast_dtype or self.precision.param_dtype)
        self.config = config = config.model_copy(update={"model": self._resolve_chunks(config)})
        if self.device.type == "cpu":
            set_heap_release(config.system.hardware.release_cpu_heap_mib)
        self.model = ForecastModel(
            config=config.model, graph=self.graph, layout=self.data.layout, multistep=config.training.multistep_input
        ).to(self.device, self.precision.param_dtype)
        parallelize(self.model, self.groups, broadcast_buffers=hardware.broadcast_buffers)
        if config.model.compile:
            compile_modules(
                self.model,
                config.model.compile,
                recompile_limit=config.model.recompile_limit,
                on_error=config.model.compile_on_error,
            )
        # several ranks: gradients in flat buckets, averaged in place; one process: freed between steps
        self.gradients = (
            GradientBuckets(self.model.parameters(), bucket_cap_mb=hardware.bucket_cap_mb)
            if self.launch.world_size > 1
            else None
        )
        opt = config.training.optimizer
        self.lr_factor = learning_rate_scale(opt.lr_scaling, self.groups.dp_size)
        self.optimizer = build_adamw(self.model.parameters(), opt, capturable=config.training.cuda_graphs)
        self.normalize_batch = self.data.device_normalizer(self.device)
        # sample positions of the model's inputs and targets, on the device once (no copy per step)
        self.input_index = torch.as_tensor(self.data.input_positions, device=self.device)
        self.output_index = torch.as_tensor(self.data.output_positions, device=self.device)
        self.val_loader = self.data.val_loader(self.loader_options("val"))  # built once: workers may persist
        # each rank of a reader group reads grid points [start, stop) of every sample; the group gathers them
        self.grid_bounds = node_shard_bounds(self.graph["data"].num_nodes, self.groups.reader_size)
        weights = [config.training.variable_loss_weights.get(n, 1.0) for n in self.data.roles.output]
        self.area_weight = torch.as_tensor(self.graph["data"].area_weight, dtype=torch.float32)
        self.loss_fn = WeightedMSE(
            area_weight=self.area_weight, variable_weight=torch.tensor(weights, dtype=torch.float32)
        ).to(self.device)
        self.step = 0
        self.captured: CapturedStep | None = None  # training.cuda_graphs: the captured step, once warmed up
        self.eager_steps = 0
        self.clock = PhaseClock(self.device)  # records only while anemo-profile turns it on
        self.graph_hash = graph_fingerprint(self.graph)
        resume = self._resume_path(config.training.resume)
        if resume is not None:
            self._resume(resume)
        LOG.info(
            "model: %.2fM parameters, graph: %d data / %d hidden nodes, device %s, run folder %s",
            sum(p.numel() for p in self.model.parameters()) / 1e6,
            self.graph["data"].num_nodes,
            self.graph["hidden"].num_nodes,
            self.device,
            self.run_dir,
        )
        if self.launch.world_size > 1 and self.is_main:
            LOG.info(
                "%d ranks: %d model instance(s) of %d rank(s) (encoder %s, processor %s, decoder %s sharding), "
                "samples read by groups of %d rank(s)%s",
                self.launch.world_size,
                self.groups.dp_size,
                self.groups.model_size,
                config.model.encoder.shard_strategy,
                config.model.processor.shard_strategy,
                config.model.decoder.shard_strategy,
                self.groups.reader_size,
                f", lr x {self.lr_factor:.3g} ({opt.lr_scaling})" if self.lr_factor != 1 else "",
            )

    def _resolve_chunks(self, config: RunConfig) -> ModelConfig:
        """The model config with ``num_chunks: auto`` replaced by counts that fit the memory budget."""
        if not has_auto_chunks(config.model):
            return config.model
        multistep = config.training.multistep_input
        budget_gb = config.system.hardware.memory_budget_gb
        budget = int(budget_gb * 2**30) if budget_gb else device_memory_bytes(self.device)
        # every rank must choose the same chunks (their collectives pair up): rank 0's budget decides; the
        # prediction is for a whole, unsharded instance, so with model sharding it errs on the side of more chunks
        budget = int(rank_zero_value(str(budget), self.launch))
        return resolve_auto_chunks(
            config.model,
            graph=self.graph,
            batch_size=config.dataloader.batch_size.train,
            num_parameters=count_parameters(config.model, self.graph, self.data.layout, multistep),
            budget_bytes=budget,
        )

    # ------------------------------------------------------------------------------------------- state
    def _resume_path(self, resume: str | None) -> Path | None:
        if resume != "auto":
            return None if resume is None else Path(resume).expanduser()
        path = latest_checkpoint(self.checkpoint_path.parent)
        if path is None:
            LOG.info("training.resume=auto: no checkpoint in %s yet, starting from step 0", self.checkpoint_path.parent)
        return path

    def _resume(self, path: Path) -> None:
        state = load_training_checkpoint(path)
        current = self.config.model_dump(mode="json")
        check_checkpoint_versions(state, path, config=current, graph_hash=self.graph_hash)
        mismatches = resume_mismatches(json.loads(state["config"]), current)
        if mismatches:
            raise ValueError(
                f"training.resume: {path} was written by a run whose config differs where the weights depend on it:\n  "
                + "\n  ".join(mismatches)
            )
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        self.step = int(state["step"])
        LOG.info("resumed from %s at step %d", path, self.step)

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"

    def save_checkpoint(self) -> None:
        save_training_checkpoint(
            self.checkpoint_path.parent,
            model=self.model,
            optimizer=self.optimizer,
            step=self.step,
            config_json=self.config.model_dump_json(),
            graph_hash=self.graph_hash,
            keep_last=self.config.training.checkpoint_keep_last,
        )
        self._last_save = time.perf_counter()

    # -------------------------------------------------------------------------------------------- loop
    def loader_options(self, split: str) -> LoaderOptions:
        return LoaderOptions.for_split(self.config.dataloader, split, self.device)

    def train_loader(self, start_sample: int) -> torch.utils.data.DataLoader:
        """This rank's training batches from global sample position ``start_sample`` (its grid slice when the
        reader group splits the grid)."""
        cfg = self.config
        return self.data.train_loader(
            self.loader_options("train"),
            seed=cfg.training.seed,
            start_sample=start_sample,
            rank=self.groups.dp_rank,
            world_size=self.groups.dp_size,
            grid=self.grid_bounds[self.groups.reader_rank] if self.groups.reader_size > 1 else None,
            limit_batches=cfg.dataloader.limit_batches.train,
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
        sizes = [stop - start for start, stop in self.grid_bounds]
        return self.prepare_batch(gather_nodes(batch, self.groups.reader_group, sizes, dim=2))

    def train_step(self, batch: torch.Tensor) -> torch.Tensor:
        """One optimiser step on a prepared batch; returns the loss (a device tensor, not read here). With
        ``training.cuda_graphs``, the step after ``cuda_graph_warmup`` eager ones is captured, later ones replay it."""
        cfg = self.config.training
        set_learning_rate(
            self.optimizer,
            self.lr_factor * learning_rate(self.step, config=cfg.optimizer, max_steps=cfg.max_steps),
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
        Free of host-device syncs, so a CUDA graph can capture it."""
        cfg = self.config.training
        steps = rollout_steps(self.step, config=cfg.rollout)
        scaler = self.precision.scaler
        loss = torch.zeros((), device=self.device)
        with self.precision.autocast():
            predictions = rollout(
                self.model,
                batch,
                multistep=cfg.multistep_input,
                steps=steps,
                input_positions=self.input_index,
                output_positions=self.output_index,
                num_prognostic=len(self.data.roles.prognostic),
            )
            for prediction, target in predictions:
                loss = loss + self.loss_fn(prediction.float(), target.float()) / steps
        self.clock.switch("decoder backward")
        (loss if scaler is None else scaler.scale(loss)).backward()
        self.clock.switch("optimizer step")
        if self.gradients is not None:
            self.gradients.average()
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        if cfg.optimizer.gradient_clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optimizer.gradient_clip_norm, foreach=True)
        if scaler is None:
            self.optimizer.step()
        else:
            scaler.step(self.optimizer)
            scaler.update()
        return loss.detach()

    def validate(self) -> ValidationResult:
        cfg = self.config
        output_index = [self.data.roles.read.index(n) for n in self.data.roles.output]
        return validate(
            self.model,
            self.val_loader,
            loss_fn=self.loss_fn,
            multistep=cfg.training.multistep_input,
            steps=cfg.training.val_rollout,
            step_length=self.data.store.frequency * self.data.stride,
            input_positions=self.data.input_positions,
            output_positions=self.data.output_positions,
            output_names=self.data.roles.output,
            num_prognostic=len(self.data.roles.prognostic),
            output_scale=self.data.normalizer.scale[output_index],
            area_weight=self.area_weight,
            device=self.device,
            climatology=self.data.climatology,
            limit_batches=cfg.dataloader.limit_batches.val,
            prepare=self.prepare_batch,
            autocast=self.precision.autocast,
        )

    def fit(self) -> RunOutputs | None:
        """Train to ``training.max_steps``; returns the outputs on rank 0 (None on other data-parallel ranks)."""
        cfg = self.config
        metrics = MetricsLog(self.run_dir / "metrics.jsonl", keep_until_step=self.step, write=self.is_main)
        loader = self.train_loader(self.step * cfg.dataloader.batch_size.train * self.groups.dp_size)
        stop_vote = StopVote()
        progress = Progress(
            total=cfg.training.max_steps, start=self.step, enabled=cfg.diagnostics.progress_bar and self.is_main
        )
        started = time.perf_counter()
        loss_sum, loss_count = torch.zeros((), device=self.device), 0
        result: ValidationResult | None = None
        self.model.train()
        batches = iter(loader)
        snapshot = cfg.diagnostics.memory_snapshot
        recorder = (
            MemorySnapshotRecorder(
                device=self.device,
                output_dir=self.run_dir / "memory_snapshot",
                warmup=snapshot.warmup,
                steps=snapshot.steps,
                max_entries=snapshot.max_entries,
            )
            if snapshot.enabled
            else None
        )
        first_step = self.step
        self._last_save = time.perf_counter()
        with PreemptionSignal() as preemption:
            while self.step < cfg.training.max_steps:
                if recorder is not None:
                    recorder.step_started(self.step - first_step)
                batch = self.prepare_train_batch(next(batches))
                loss_sum += self.train_step(batch)
                loss_count += 1
                self.step += 1
                last = self.step == cfg.training.max_steps
                now = time.perf_counter()
                over_budget = cfg.training.max_minutes is not None and now - started > 60 * cfg.training.max_minutes
                # every rank stops at the same step: a signal or the budget on one rank stops them all
                preempted, out_of_time = stop_vote((preemption.received is not None, over_budget))
                stopping = last or out_of_time or preempted
                if self.step % cfg.diagnostics.log_every_n_steps == 0 or stopping:
                    record = {
                        "step": self.step,
                        "train_loss": float(mean_over_ranks(loss_sum)) / loss_count,
                        "lr": float(self.optimizer.param_groups[0]["lr"]),  # a tensor under CUDA graphs
                        "rollout": rollout_steps(self.step - 1, config=cfg.training.rollout),
                        "it_per_s": progress.rate(self.step),
                    }
                    metrics.write(record)
                    progress.update(self.step, loss=record["train_loss"])
                    loss_sum, loss_count = torch.zeros((), device=self.device), 0
                if preempted:
                    stop_vote.finish()
                    if self.is_main:
                        self.save_checkpoint()
                    progress.close()
                    LOG.warning(
                        "received %s: stopped after step %d, checkpoint %s written; exiting with status 0 "
                        "(training.resume=auto continues from it)",
                        preemption.received or "a stop signal on another rank",
                        self.step,
                        self.checkpoint_path,
                    )
                    raise Preempted
                every_minutes = cfg.training.checkpoint_every_minutes
                timed_save = every_minutes is not None and now - self._last_save > 60 * every_minutes
                if self.is_main and (  # before validation: a validation that fails cannot lose the step's checkpoint
                    self.step % cfg.training.checkpoint_every_n_steps == 0 or last or out_of_time or timed_save
                ):
                    self.save_checkpoint()
                if self.step % cfg.training.val_every_n_steps == 0 or last or out_of_time:
                    if self.validates:
                        result = self.validate()
                        metrics.write({"step": self.step, **result.as_record()})
                    barrier()
                if out_of_time:
                    LOG.info(
                        "training.max_minutes (%s) reached at step %d: stopping", cfg.training.max_minutes, self.step
                    )
                    break
            stop_vote.finish()
        progress.close()
        if recorder is not None:
            recorder.close()
        if self.validates and result is None:  # resumed at or past max_steps: score the checkpoint
            result = self.validate()
            if not metrics.has(self.step, "val_loss"):  # a resume of a finished run records it once
                metrics.write({"step": self.step, **result.as_record()})
        sample = self._forecast_sample() if self.validates and cfg.diagnostics.plots else None
        if not self.is_main:  # rank 0 writes the run's outputs
            release_process_group()
            return None
        outputs = self._finish(result, metrics, time.perf_counter() - started, sample)
        release_process_group()
        return outputs

    # ---------------------------------------------------------------------------------------- outputs
    def _finish(
        self,
        result: ValidationResult,
        metrics: MetricsLog,
        seconds: float,
        sample: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> RunOutputs:
        inference_path = self.run_dir / "inference.pt"
        save_inference_checkpoint(
            inference_path,
            model=self.model,
            config=self.config,
            roles=self.data.roles,
            normalizer=self.data.normalizer,
            graph=self.graph,
        )
        table = result.table()
        (self.run_dir / "validation.md").write_text(table + "\n")
        if self.config.diagnostics.plots:
            plot_loss_curve(metrics.records, self.run_dir / "loss_curve.png")
            plot_rmse_by_lead(
                variables=result.variables,
                lead_hours=result.lead_hours,
                model=result.model_rmse,
                persistence=result.persistence_rmse,
                climatology=result.climatology_rmse,
                path=self.run_dir / "rmse_by_lead.png",
            )
            self._plot_forecast(*sample)
        peak = peak_rss_mib()
        LOG.info(
            "trained to step %d in %.0f s, peak memory %s MiB\nvalidation (%d samples):\n%s\n%s\n"
            "outputs in %s: inference.pt, checkpoints/last.pt, metrics.jsonl, validation.md%s",
            self.step,
            seconds,
            "n/a" if peak is None else f"{peak:.0f}",
            result.num_samples,
            table,
            "model beats persistence on every prognostic variable at the first lead time"
            if result.beats_persistence()
            else "model does NOT beat persistence on every prognostic variable yet",
            self.run_dir,
            ", loss_curve.png, rmse_by_lead.png, forecast_map.png" if self.config.diagnostics.plots else "",
        )
        return RunOutputs(self.run_dir, self.checkpoint_path, inference_path, metrics.path, result)

    @torch.no_grad()
    def _forecast_sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first validation sample's first-lead (prediction, target), (B, G, V_out) each (every rank of a
        sharded model instance takes part)."""
        self.model.eval()
        batch = self.prepare_batch(self.data.val[0].unsqueeze(0))
        with self.precision.autocast():
            prediction, target = next(
                rollout(
                    self.model,
                    batch,
                    multistep=self.config.training.multistep_input,
                    steps=1,
                    input_positions=self.data.input_positions,
                    output_positions=self.data.output_positions,
                    num_prognostic=len(self.data.roles.prognostic),
                )
            )
        self.model.train()
        return prediction.float(), target.float()

    def _plot_forecast(self, prediction: torch.Tensor, target: torch.Tensor) -> None:
        roles = self.data.roles
        name = self.config.diagnostics.plot_variable or roles.prognostic[0]
        v = roles.output.index(name)
        r = roles.read.index(name)
        to_physical = self.data.normalizer.scale[r], self.data.normalizer.offset[r]
        truth = target[0, :, v].cpu().numpy() * to_physical[0] + to_physical[1]
        forecast = prediction[0, :, v].cpu().numpy() * to_physical[0] + to_physical[1]
        date = self.data.val.dates(0)[self.config.training.multistep_input]
        plot_forecast_map(
            lat=self.data.store.latitudes,
            lon=self.data.store.longitudes,
            truth=truth,
            forecast=forecast,
            title=f"{name} at {date}, first lead time",
            path=self.run_dir / "forecast_map.png",
        )

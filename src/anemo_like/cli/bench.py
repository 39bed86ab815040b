"""``anemo-bench --config-name=NAME key=value ...``: training throughput in io, synthetic and full modes.

Same configs and overrides as ``anemo-train``; ``diagnostics.bench.*`` sets the batch counts and modes. Prints
a table, the bound and the next knob, and one JSON line on stdout (also written to ``<run folder>/bench.json``).
"""

from __future__ import annotations

import json
import logging
import sys

from anemo_like.cli.hydra_entry import claimed_run_folder, run_hydra_command, set_up_or_exit, training_process_group
from anemo_like.config import RunConfig

LOG = logging.getLogger("anemo_like")


def _bench(config: RunConfig) -> None:
    from anemo_like.profiling.throughput import available_cores, diagnose, measure_throughput
    from anemo_like.training.tracking import open_tracker, tracked
    from anemo_like.training.trainer import Trainer

    with training_process_group(config), claimed_run_folder(config):
        trainer = set_up_or_exit(lambda: Trainer(config))
        with tracked(open_tracker(trainer.run, step=trainer.step)):  # diagnostics.tracking: params and status
            rates = measure_throughput(trainer)
    if not trainer.is_main:
        return
    cores = available_cores()
    diagnosis = diagnose(rates, config, device=trainer.device, cores=cores)
    loader = config.dataloader
    record = {
        **{f"{mode}_samples_per_s": round(rate, 3) for mode, rate in rates.items()},
        "bound": diagnosis.bound,
        "advice": diagnosis.advice,
        "batch_size": loader.batch_size.train,
        "num_workers": loader.num_workers.train,
        "pin_memory": loader.pin_memory,
        "normalize_on_device": loader.normalize_on_device,
        "precision": config.training.precision,
        "device": str(trainer.device),
        "cores": cores,
    }
    table = "\n".join(f"  {mode.upper():<10} {rate:10.2f} samples/s" for mode, rate in rates.items())
    LOG.info(
        "throughput (%d timed batches per mode):\n%s\nbound: %s\nnext: %s",
        config.diagnostics.bench.batches,
        table,
        diagnosis.bound,
        diagnosis.advice,
    )
    (trainer.run_dir / "bench.json").write_text(json.dumps(record) + "\n")
    print(json.dumps(record), flush=True)


def main() -> None:
    run_hydra_command("anemo-bench", _bench, sys.argv[1:], claims_run_folder=True)


if __name__ == "__main__":
    main()

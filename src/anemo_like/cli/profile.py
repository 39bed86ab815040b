"""``anemo-profile [--doctor] --config-name=NAME key=value ...``: profile a short training run into a report.

Same configs and overrides as ``anemo-train``; ``diagnostics.profile.*`` sets the step counts and the report
folder (default ``<system.paths.output>/profile``). ``--doctor`` adds the performance doctor's findings to the
report and prints them.
"""

from __future__ import annotations

import logging
import sys

from anemo_like.cli.hydra_entry import claimed_run_folder, run_hydra_command, set_up_or_exit, training_process_group
from anemo_like.config import RunConfig

LOG = logging.getLogger("anemo_like")
DOCTOR_FLAG = "--doctor"


def _profile(config: RunConfig, *, doctor: bool) -> None:
    from anemo_like.profiling.doctor import diagnose, render
    from anemo_like.profiling.run import profile_training
    from anemo_like.training.tracking import open_tracker, tracked
    from anemo_like.training.trainer import Trainer

    with training_process_group(config), claimed_run_folder(config):
        trainer = set_up_or_exit(lambda: Trainer(config))
        report = profile_training(trainer.config, trainer=trainer)
    if report is None:
        return
    output = report.output
    if doctor:  # the resolved config: num_chunks: auto replaced by the counts the run used
        findings = render(diagnose(report.summary(), trainer.config))
        (output / "doctor.md").write_text(findings)
        with (output / "report.md").open("a") as f:
            f.write("\n" + findings)
        LOG.info("%s", findings)
    LOG.info("profile report: %s", output / "report.md")
    tracker = open_tracker(trainer.run, step=trainer.step)  # diagnostics.tracking: the report as artifacts
    with tracked(tracker):
        for name in ("report.md", "report.json", "doctor.md"):
            if tracker is not None and (output / name).is_file():
                tracker.log_artifact(output / name, "profile")


def main() -> None:
    argv = sys.argv[1:]
    doctor = DOCTOR_FLAG in argv
    run_hydra_command(
        "anemo-profile",
        lambda config: _profile(config, doctor=doctor),
        [a for a in argv if a != DOCTOR_FLAG],
        claims_run_folder=True,
    )


if __name__ == "__main__":
    main()

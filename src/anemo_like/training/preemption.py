"""Stop cleanly when the scheduler asks: SIGTERM (``scancel``, the end of a time limit), SIGUSR1 (SLURM's
``--signal=USR1@<seconds>`` warning before the limit) or SIGINT (Ctrl-C) during the training loop. The current step
finishes, a checkpoint is written, and the process exits with status 0, so ``training.resume: auto`` (with
``sbatch --requeue``) carries on. Signals in the other phases: :mod:`anemo_like.interrupts`."""

from __future__ import annotations


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written: exits the program with status 0."""

    def __init__(self) -> None:
        super().__init__(0)

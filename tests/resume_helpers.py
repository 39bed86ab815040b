"""A training run killed right after it wrote the checkpoint of a given step, for the exact-resume tests."""

from __future__ import annotations

import pytest

from anemo_like.training import run_checkpoints as checkpoints_module


class Killed(Exception):
    """The stand-in for a kill: raised once the checkpoint of the step is on disk."""


def die_after_checkpoint(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """From now on (until ``monkeypatch.undo()``) a run raises :class:`Killed` once it saved step ``step``."""
    save = checkpoints_module.save_training_checkpoint

    def save_then_die(path, **kwargs):
        save(path, **kwargs)
        if kwargs["step"] == step:
            raise Killed

    monkeypatch.setattr(checkpoints_module, "save_training_checkpoint", save_then_die)

"""Training: the loop, loss, rollout, validation, schedules and checkpoints."""

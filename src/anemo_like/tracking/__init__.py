"""Experiment tracking, offline first: a run's parameters, metrics, tags and artifacts are recorded in its folder
(:mod:`~anemo_like.tracking.record`) and copied to an MLflow server in the background or later by ``anemo-sync``
(:mod:`~anemo_like.tracking.sync`). Imports only ``config`` and the base modules; MLflow is imported lazily."""

"""Inference: run forecasts from an inference checkpoint, write and verify them (``anemo-infer``).

The checkpoint names (from :mod:`anemo_like.checkpoints.inference`) load lazily: importing this package does not
import torch.
"""

from importlib import import_module
from typing import Any

__all__ = ["InferenceBundle", "load_inference_checkpoint", "save_inference_checkpoint"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("anemo_like.checkpoints.inference"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""Inference: load an inference checkpoint and run forecasts (``anemo-infer``).

The checkpoint names load lazily, so ``anemo_like.inference.config`` validates a config without importing torch.
"""

from importlib import import_module
from typing import Any

__all__ = ["InferenceBundle", "load_inference_checkpoint", "save_inference_checkpoint"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(import_module("anemo_like.inference.checkpoint"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

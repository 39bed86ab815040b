"""Chunk counts for inference from the environment, read at every eval-mode forward (not once at import).

``ANEMOI_INFERENCE_NUM_CHUNKS_MAPPER`` / ``ANEMOI_INFERENCE_NUM_CHUNKS_PROCESSOR`` override one component;
``ANEMOI_INFERENCE_NUM_CHUNKS`` is the default for both. Unset or empty: the configured chunking applies.
"""

from __future__ import annotations

import os
from typing import Literal

from anemo_like.models.window_attention import requested_backend

BASE_VARIABLE = "ANEMOI_INFERENCE_NUM_CHUNKS"


def inference_num_chunks(component: Literal["MAPPER", "PROCESSOR"]) -> int | None:
    """Chunk count requested for ``component``, or None when no variable is set."""
    for name in (f"{BASE_VARIABLE}_{component}", BASE_VARIABLE):
        value = os.environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"environment variable {name}={value!r}: expected a positive integer")
            return int(value)
    return None


def check_inference_environment() -> None:
    """Fail at set-up, not mid-run, on a bad ``ANEMOI_INFERENCE_*`` chunk or transformer-backend variable."""
    for component in ("MAPPER", "PROCESSOR"):
        inference_num_chunks(component)
    requested_backend("scaled_dot_product_attention", training=False)

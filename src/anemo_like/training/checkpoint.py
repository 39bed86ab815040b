"""Checkpoints: a training checkpoint that resumes exactly, and a self-contained inference checkpoint.

Both are plain dicts of tensors and Python primitives, loadable with ``torch.load(weights_only=True)``, and are
written atomically (temporary file, fsync, rename): a crash during a save leaves the previous file intact.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from anemo_like.atomic_io import atomic_torch_save

TRAINING_FORMAT = "anemo_like-training-v1"


def rng_state() -> dict[str, Any]:
    """RNG states of torch, numpy and Python as tensors/primitives (weights_only-safe)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2])},
        "python": {"version": py_state[0], "state": list(py_state[1]), "gauss": py_state[2]},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(("MT19937", state["numpy"]["keys"].numpy().astype(np.uint32), state["numpy"]["pos"], 0, 0.0))
    random.setstate((state["python"]["version"], tuple(state["python"]["state"]), state["python"]["gauss"]))


def save_training_checkpoint(
    path: Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, config_json: str
) -> None:
    atomic_torch_save(
        {
            "format": TRAINING_FORMAT,
            "step": step,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "rng": rng_state(),
            "config": config_json,
        },
        path,
    )


def load_training_checkpoint(path: Path) -> dict[str, Any]:
    """Read a training checkpoint; raises naming the file when it is missing or of another format."""
    if not path.is_file():
        raise FileNotFoundError(f"training checkpoint {path} does not exist (training.resume)")
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != TRAINING_FORMAT:
        raise ValueError(f"{path} is not an anemo_like training checkpoint (expected format {TRAINING_FORMAT})")
    return state


# Sections of the config that must match for a checkpoint's weights and optimizer state to fit the run ...
RESUME_MUST_MATCH = ("model", "graph", "data.variables", "data.normalizer", "data.timestep", "training.multistep_input")
# ... except keys that change how the model runs, not its weights (e.g. more chunks after an out-of-memory).
RESUME_MAY_DIFFER = ("num_chunks", "shard_strategy", "gradient_checkpointing", "graph_attention_backend")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flatten(item, f"{prefix}.{key}").items()}
    return {prefix: value}


def resume_mismatches(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """Keys under RESUME_MUST_MATCH whose values differ between two config dicts, as 'key: saved -> current'."""
    differences = []
    for section in RESUME_MUST_MATCH:
        old, new = saved, current
        for part in section.split("."):
            old, new = old.get(part, {}), new.get(part, {})
        flat_old, flat_new = _flatten(old, section), _flatten(new, section)
        for key in sorted(flat_old.keys() | flat_new.keys()):
            if key.rsplit(".", 1)[-1] not in RESUME_MAY_DIFFER and flat_old.get(key) != flat_new.get(key):
                differences.append(f"{key}: {flat_old.get(key)!r} -> {flat_new.get(key)!r}")
    return differences

"""Per-variable affine normalisation from dataset statistics: normalised = (physical - offset) / scale."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Normalizer:
    """Offsets and scales per variable, in the order of ``names``."""

    names: list[str]
    offset: np.ndarray  # (V,) float64, physical units
    scale: np.ndarray  # (V,) float64, physical units per normalised unit

    @classmethod
    def from_statistics(
        cls,
        *,
        names: Sequence[str],
        statistics: Mapping[str, np.ndarray],
        methods: Sequence[str],
        source: str,
    ) -> Normalizer:
        """Build from per-variable ``mean``/``stdev``/``minimum``/``maximum`` (each (V,)) and a method per variable:
        mean-std (x - mean) / stdev, std x / stdev, min-max (x - min) / (max - min), max x / max, none x.

        ``source`` names where the statistics came from, for error messages.
        """
        offset = np.zeros(len(names))
        scale = np.ones(len(names))
        for i, (name, method) in enumerate(zip(names, methods, strict=True)):
            if method == "mean-std":
                offset[i], scale[i] = statistics["mean"][i], statistics["stdev"][i]
            elif method == "std":
                scale[i] = statistics["stdev"][i]
            elif method == "min-max":
                offset[i], scale[i] = statistics["minimum"][i], statistics["maximum"][i] - statistics["minimum"][i]
            elif method == "max":
                scale[i] = statistics["maximum"][i]
            elif method != "none":
                raise ValueError(
                    f"unknown normaliser '{method}' for variable '{name}'; use mean-std, std, min-max, max or none"
                )
            if not np.isfinite(scale[i]) or scale[i] <= 0 or not np.isfinite(offset[i]):
                raise ValueError(
                    f"{source}: variable '{name}' has unusable statistics for '{method}' normalisation "
                    f"(offset {offset[i]}, scale {scale[i]}); fix the statistics or leave it unnormalised "
                    f"(data.normalizer.per_variable.{name}: none)"
                )
        return cls(list(names), offset, scale)

    def normalize(self, values: np.ndarray, axis: int = -1) -> np.ndarray:
        """Physical -> normalised along ``axis`` (the variable axis), float32, computed in float32 in one new
        array (a float64 intermediate costs 4x the memory traffic: 0.12 s of a 0.23 s O320 sample read)."""
        shape = [1] * values.ndim
        shape[axis] = -1
        out = np.array(values, dtype=np.float32)
        out -= self.offset.astype(np.float32).reshape(shape)
        out /= self.scale.astype(np.float32).reshape(shape)
        return out

    def denormalize(self, values: np.ndarray, axis: int = -1) -> np.ndarray:
        """Normalised -> physical along ``axis``."""
        shape = [1] * values.ndim
        shape[axis] = -1
        return values * self.scale.reshape(shape) + self.offset.reshape(shape)

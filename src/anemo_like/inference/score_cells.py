"""One score as the verification table and JSON show it (NaN as ``n/a`` and null)."""

from __future__ import annotations

import numpy as np


def format_score(value: float) -> str:
    """A table cell: 4 significant digits, ``n/a`` for NaN."""
    return "n/a" if not np.isfinite(value) else f"{value:.4g}"


def json_score(value: float) -> float | None:
    """A JSON number, None (null) for NaN or inf."""
    return float(value) if np.isfinite(value) else None

"""Numbers as the views print them, and the statistics of a header line: no Rich here, so
that a view laid out without it (render.heads) can use them too."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


def shape_str(shape) -> str:
    return " × ".join(str(n) for n in shape) if len(shape) else "scalar"


def stats(arr: np.ndarray) -> dict:
    """min, mean, max, std over the finite entries (masked scores are -inf)."""
    import numpy as np

    a = np.asarray(arr, dtype=np.float64)
    finite = a[np.isfinite(a)]
    if finite.size == 0:
        return {"min": None, "mean": None, "max": None, "std": None}
    return {"min": float(finite.min()), "mean": float(finite.mean()),
            "max": float(finite.max()), "std": float(finite.std())}


def fmt(x: float, width: int = 0) -> str:
    if not math.isfinite(x):
        return "-inf" if x < 0 else ("inf" if x > 0 else "nan")
    if x != 0 and (abs(x) >= 1e4 or abs(x) < 1e-3):
        return f"{x:.2e}"
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"

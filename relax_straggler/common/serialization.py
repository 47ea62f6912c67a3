"""Strict-JSON conversion shared by the reporters, the analysis summary and the monitor."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def json_safe(x: Any) -> Any:
    """x with non-finite floats as None and numpy scalars as Python numbers, recursively
    through dicts, lists and tuples (strict JSON has no NaN)."""
    if isinstance(x, np.floating):
        x = float(x)
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, dict):
        return {k: json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x

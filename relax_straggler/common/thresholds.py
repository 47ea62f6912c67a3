"""The thresholds that call a rank slow: one home for their defaults and their bounds.

The slow-rank rule: against its comparison group's reference ``ref`` (ms), a rank is slow
in a compute stage when ``t >= ref x relative_threshold`` or ``t - ref >=
absolute_ms_threshold``; in a communication stage, whose durations include waiting for
peers, the rank that arrived last is late when ``t x relative_threshold <= ref`` or
``ref - t >= absolute_ms_threshold`` (docs/ARCHITECTURE.md invariant 7). The per-step
verdict applies it to each sampled step, the confirmed verdict takes it as the minimum
effect size of one report, offline attribution asks both parts.

The window ensemble has its own two: a slow cluster must be at least ``WINDOW_MIN_SLOWDOWN``
(relative) slower than the main body, and ``WINDOW_MIN_VOTES`` of its six clusterers must
agree before a rank is reported.

Every default is the engine's (csrc/core/thresholds.h, csrc/core/detect), read through
relax_straggler._core, so the Python configurations (StragglerConfig, ConfirmConfig,
AnalyzeConfig, WindowConfig) and the engine cannot disagree. Loading it never imports torch.
"""

from __future__ import annotations

from typing import Optional

from relax_straggler._ext import core
from relax_straggler.common.validators import is_finite

RELATIVE_THRESHOLD: float = core().DEFAULT_RELATIVE_THRESHOLD  # dimensionless
ABSOLUTE_MS_THRESHOLD: float = core().DEFAULT_ABSOLUTE_MS_THRESHOLD  # ms
WINDOW_MIN_SLOWDOWN: float = core().detect.DEFAULT_MIN_SLOWDOWN  # dimensionless, >= 0
WINDOW_MIN_VOTES: int = core().detect.DEFAULT_MIN_ALGORITHM_VOTES  # of the six clusterers

# The lower bound of each threshold of the slow-rank rule: a relative threshold below 1
# would call the reference itself slow, a negative excess every rank.
_LOWEST = {"relative_threshold": 1.0, "absolute_ms_threshold": 0.0}
FIELDS: tuple[str, ...] = tuple(_LOWEST)  # the slow-rank rule's two fields, as every configuration names them


def violation(field: str, value: object) -> Optional[str]:
    """Why `value` cannot be the slow-rank rule's `field` ("relative_threshold" or
    "absolute_ms_threshold"), as "must be a finite number >= 1"; None when it can.
    Raises KeyError for another field."""
    lowest = _LOWEST[field]
    if is_finite(value) and value >= lowest:
        return None
    return f"must be a finite number >= {lowest:g}"

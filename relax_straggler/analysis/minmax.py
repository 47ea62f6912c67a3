"""What a min/max-only timer log (Megatron's default --timing-log-option minmax, or max)
can and cannot say.

Per stage it keeps the widest spread max/min over the steps and the mean spread in ms.
A spread shows that some rank is slower than another in that stage; it cannot say which
rank, whether one rank or a whole pipeline stage is slow (individual vs structural), nor,
for communication, who made the others wait (the longest time is a waiting rank).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from relax_straggler.common.stages import STAGES, is_communication
from relax_straggler.readers import MinMaxStep

LIMITATIONS = (
    "min/max timer logs give no per-rank times: no rank or node can be named (rerun with "
    "--timing-log-option all)",
    "min/max timer logs cannot tell one slow worker from a slow pipeline stage (structural imbalance)",
    "a communication spread shows waiting; min/max logs cannot say which rank made the others wait",
)


@dataclass
class MinMaxSummary:
    steps: int = 0
    max_only: bool = False
    spread_max: np.ndarray = field(default_factory=lambda: np.full(len(STAGES), np.nan))  # max/min
    spread_step: np.ndarray = field(default_factory=lambda: np.full(len(STAGES), -1, dtype=np.int64))
    sum_gap_ms: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES)))  # max - min
    gap_count: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), dtype=np.int64))
    sum_max_ms: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES)))
    max_count: np.ndarray = field(default_factory=lambda: np.zeros(len(STAGES), dtype=np.int64))

    def add(self, step: MinMaxStep) -> None:
        self.steps += 1
        has_max = np.isfinite(step.max_ms)
        self.sum_max_ms[has_max] += step.max_ms[has_max]
        self.max_count += has_max
        both = has_max & np.isfinite(step.min_ms)
        if not both.any():
            self.max_only = True
            return
        gap = step.max_ms - step.min_ms
        self.sum_gap_ms[both] += gap[both]
        self.gap_count += both
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(both & (step.min_ms > 0), step.max_ms / step.min_ms, np.nan)
        wider = np.isfinite(ratio) & ~(ratio <= self.spread_max)
        self.spread_max[wider] = ratio[wider]
        self.spread_step[wider] = step.step

    def stages(self, relative_threshold: float, absolute_ms_threshold: float) -> list[dict]:
        """One entry per stage seen: mean max ms, widest max/min, mean gap ms, and whether
        the spread passes the straggler thresholds somewhere (a spread, not a rank)."""
        out = []
        for j, name in enumerate(STAGES):
            if self.max_count[j] == 0:
                continue
            entry = {"stage": name, "communication": is_communication(name),
                     "mean_max_ms": self.sum_max_ms[j] / self.max_count[j]}
            if self.gap_count[j]:
                mean_gap = self.sum_gap_ms[j] / self.gap_count[j]
                spread = self.spread_max[j] >= relative_threshold and mean_gap >= absolute_ms_threshold
                entry.update(widest_max_over_min=float(self.spread_max[j]), widest_step=int(self.spread_step[j]),
                             mean_gap_ms=float(mean_gap), spread=bool(spread))
            out.append(entry)
        return out

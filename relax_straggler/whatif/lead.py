"""Which worker the live what-if names, and when: a lead that outlasts the job's own noise.

One sampled step's replay always has a worker with the highest score min(S_dp, S_stage),
and on a healthy job that worker changes from step to step while S itself moves by tenths
(scheduling, the host). So a worker is named only when the evidence repeats:

    spread     S's own noise from one report to the next: 1.4826 x the median of |S_i -
               S_(i-1)| / sqrt(2) over the last `memory` such differences, at least `min_spread`,
               taken from the reports before this one. Differences of consecutive reports:
               a slow worker that lifts S for good moves it once, so it does not widen the
               spread, and every report counts, so no early estimate can stick
    typical    the median of S over the last `memory` reports that named nobody
    lead       this report's leader (highest score) and its score minus the runner-up's
    named      this report's leader, when it led in at least c of the last `window` reports
               (this one included) and by more than the spread in at least `confirm` of
               them; c is the least count that a leader drawn at random among the job's W
               workers each report (a healthy job's leader rotates) reaches in at most
               `chance` of reports: W x P(Binomial(window, 1 / W) >= c) <= chance (c =
               window for W = 2, 4 for W = 4 with the defaults); nobody before
               `min_reports` reports have given a spread. Scores that are not finite
               (a worker the replay could not score) are left out

A worker whose ops cost the step more than the job's own spread of S is named c reports
after it starts; a report in which another worker's noise outgrew it names nobody, and,
where c < window (4 workers or more), the next one it leads names it again (on a crowded
host the slowed worker of a PP 2 x DP 2 run led 18 of 22 reports, beyond the spread in
fewer); with 2 or 3 workers (c = window) it is named again after window leads in a row.
The named worker's give-back (the share of the lost time that fixing it returns) is
published with it and only then.
"""

from __future__ import annotations

import collections
import math
import numbers
from dataclasses import dataclass
from typing import Mapping, Optional

import numpy as np

_MAD_TO_SIGMA = 1.4826  # the MAD of a normal distribution x 1.4826 = its sigma


@dataclass(frozen=True)
class LeadConfig:
    """Settings of the named worker (module docstring). Raises ValueError naming the field."""

    memory: int = 16  # recent reports the spread and the typical S are taken over
    min_reports: int = 3  # reports before anyone can be named (the spread needs 2 differences)
    window: int = 5  # recent reports a lead is counted over
    confirm: int = 2  # of the leads in the window, those by more than the spread
    chance: float = 0.1  # the share of reports a rotating leader may reach the leads counted
    min_spread: float = 0.02  # floor of the spread: a lead under 2 % of the step is no cost (the impact rule)

    def __post_init__(self) -> None:
        for name in ("memory", "min_reports", "window", "confirm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"LeadConfig.{name} must be an integer >= 1, got {value!r}")
        if self.min_reports < 3 or self.min_reports > self.memory + 1:
            raise ValueError(f"LeadConfig.min_reports must be in 3..memory + 1 ({self.memory + 1}), "
                             f"got {self.min_reports}")
        if self.confirm > self.window:
            raise ValueError(f"LeadConfig.confirm must be <= window ({self.window}), got {self.confirm}")
        if not (_is_real(self.chance) and 0.0 < self.chance < 1.0):
            raise ValueError(f"LeadConfig.chance must be in (0, 1), got {self.chance!r}")
        if not (_is_real(self.min_spread) and math.isfinite(self.min_spread) and self.min_spread >= 0.0):
            raise ValueError(f"LeadConfig.min_spread must be a finite number >= 0, got {self.min_spread!r}")


def _is_real(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Lead:
    """The answer for one report. typical / spread: the typical S and S's noise over the
    reports before it (module docstring; NaN until there are two, three); leader / lead:
    this report's highest-scoring
    worker (dp_rank, stage) and its score minus the runner-up's (0 with one worker);
    named: the worker confirmed by the rule, or None."""

    typical: float
    spread: float
    leader: tuple[int, int]
    lead: float
    named: Optional[tuple[int, int]]


class WhatIfLead:
    """Keeps the recent reports of one job (the metrics rank's report thread; not thread-safe)."""

    def __init__(self, config: Optional[LeadConfig] = None) -> None:
        self.config = config or LeadConfig()
        self._recent: collections.deque[float] = collections.deque(maxlen=self.config.memory + 1)  # every S
        self._healthy: collections.deque[float] = collections.deque(maxlen=self.config.memory)  # S naming nobody
        # (leader, led beyond the spread) of the recent reports
        self._leads: collections.deque[tuple[tuple[int, int], bool]] = collections.deque(maxlen=self.config.window)

    def update(self, slowdown: float, scores: Mapping[tuple[int, int], float]) -> Lead:
        """Judges one report. slowdown: its S (> 0, finite); scores: each worker's
        min(S_dp, S_stage), at least one finite (the others are left out). Raises ValueError
        on an S that is no finite number > 0 or no finite score."""
        if not (_is_real(slowdown) and math.isfinite(slowdown) and slowdown > 0.0):
            raise ValueError(f"slowdown must be a finite number > 0, got {slowdown!r}")
        finite = {w: float(v) for w, v in scores.items() if _is_real(v) and math.isfinite(v)}
        if not finite:
            raise ValueError(f"scores must hold at least one finite score, got {dict(scores)!r}")
        ranked = sorted(finite.items(), key=lambda kv: (-kv[1], kv[0]))
        leader, top = ranked[0]
        lead = top - ranked[1][1] if len(ranked) > 1 else 0.0
        typical, spread = self._typical(), max(self._spread(), self.config.min_spread)  # NaN stays NaN
        learned = len(self._recent) >= self.config.min_reports
        beyond = learned and lead > spread
        self._leads.append((leader, beyond))
        led = [b for w, b in self._leads if w == leader]
        enough = len(led) >= self.leads_needed(len(finite)) and sum(led) >= self.config.confirm
        named = leader if learned and enough else None
        self._recent.append(float(slowdown))
        if named is None:
            self._healthy.append(float(slowdown))
        return Lead(typical=typical, spread=spread, leader=leader, lead=lead, named=named)

    def leads_needed(self, workers: int) -> int:
        """c of the module docstring for a job of `workers` (>= 1) workers: the least count
        of leads in `window` reports that a leader drawn at random reaches in at most
        `chance` of reports (union bound over the workers); `window` when none is that rare."""
        n, p = self.config.window, 1.0 / max(workers, 1)
        tail = 0.0  # P(Binomial(n, p) >= c), from c = n down
        for c in range(n, 0, -1):
            tail += math.comb(n, c) * p**c * (1.0 - p) ** (n - c)
            if workers * tail > self.config.chance:
                return min(c + 1, n)
        return 1

    def _typical(self) -> float:
        """The median S of the recent reports that named nobody; NaN before two."""
        return float(np.median(np.fromiter(self._healthy, dtype=np.float64))) if len(self._healthy) >= 2 else math.nan

    def _spread(self) -> float:
        """S's noise from report to report (module docstring); NaN before three reports."""
        if len(self._recent) < 3:
            return math.nan
        steps = np.abs(np.diff(np.fromiter(self._recent, dtype=np.float64)))
        return _MAD_TO_SIGMA * float(np.median(steps)) / math.sqrt(2.0)

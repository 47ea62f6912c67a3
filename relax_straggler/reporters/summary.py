"""Tallies reports into a run summary: which rank was flagged in which stage, how often."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np

from relax_straggler.report import Report


@dataclass(frozen=True)
class Finding:
    rank: int
    stage: str
    flagged: int  # reports in which this rank was a straggler in this stage
    reports: int  # reports in which the stage was measured
    median_slowdown: float  # median of (rank's time / reference) over the flagged reports

    def __str__(self) -> str:
        return (f"rank {self.rank} in {self.stage}: flagged in {self.flagged}/{self.reports} reports, "
                f"median {self.median_slowdown:.2f}x the reference")


class RunSummary:
    """A sink that keeps counts only (bounded memory whatever the run length)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports = 0
        self._stage_reports: collections.Counter[str] = collections.Counter()
        self._flags: collections.Counter[tuple[int, str]] = collections.Counter()
        self._ratios: dict[tuple[int, str], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=256))
        self._bottlenecks: collections.Counter[str] = collections.Counter()

    def __call__(self, report: Report) -> None:
        ref = {s: report.metrics[f"straggler/{s}/ref_ms"] for s in report.stages}
        with self._lock:
            self.reports += 1
            if report.likely_bottleneck:
                self._bottlenecks[report.likely_bottleneck] += 1
            for j, stage in enumerate(report.stages):
                self._stage_reports[stage] += 1
                for rank in report.stragglers.get(stage, ()):
                    self._flags[(rank, stage)] += 1
                    if ref[stage] > 0:
                        self._ratios[(rank, stage)].append(report.judged_ms[rank, j] / ref[stage])

    def findings(self) -> list[Finding]:
        """(rank, stage) pairs ever flagged, most often flagged first."""
        with self._lock:
            return [Finding(rank, stage, n, self._stage_reports[stage],
                            float(np.median(self._ratios[(rank, stage)])) if self._ratios[(rank, stage)] else float("nan"))
                    for (rank, stage), n in self._flags.most_common()]

    def top(self) -> Optional[Finding]:
        found = self.findings()
        return found[0] if found else None

    def bottlenecks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bottlenecks.most_common())

    def __repr__(self) -> str:
        return "RunSummary()"

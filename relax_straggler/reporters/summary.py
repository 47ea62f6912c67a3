"""Tallies reports into a run summary: the confirmed verdict (which rank was confirmed a
straggler in which stage, from when, in how many reports, with the finding's ratio) and the
per-step flags (which rank was flagged in which stage, how often). Each quantity is
defined once in docs/METRICS.md, "Ratios and excesses"."""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from typing import Optional

import numpy as np

from relax_straggler.common.metric_names import stage_prefix
from relax_straggler.common.stages import is_communication
from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink


@dataclass(frozen=True)
class Flag:
    """A (rank, stage) the per-step rule flagged (t >= ref x relative or t - ref >= absolute ms): flagged: reports in which it was;
    reports: reports in which the stage was measured; median_flag_ratio: median, over the
    flagged reports, of its time over the stage's reference (ref_ms) in the rule's
    direction: t / ref for compute stages, ref / t for communication stages, where the rank
    that arrives last has the shortest time. A flag is >= 1 by the rule."""

    rank: int
    stage: str
    flagged: int
    reports: int
    median_flag_ratio: float

    def __str__(self) -> str:
        how = "arrived last, reference" if is_communication(self.stage) else "its time"
        return (f"rank {self.rank} in {self.stage}: flagged in {self.flagged}/{self.reports} reports, "
                f"median {self.median_flag_ratio:.2f}x ({how} over the reference)")


@dataclass(frozen=True)
class Confirmed:
    """A (rank, stage) the confirmed verdict named a straggler: first_step: the since_step of
    its first confirmation; reports: reports that named it; reports_after: reports from its
    first confirmation on; ratio: the finding's ratio (relax_straggler.judge.confirm.Finding.ratio)
    in the last report that named it; median_excess_ms: median of its excess over the group's
    reference (ms) over the reports that named it; cause: the inferred cause most often
    given; last_step: the step of the last report that named it; to_end: whether the run's
    last report still named it (else the verdict released it after last_step)."""

    rank: int
    stage: str
    first_step: int
    reports: int
    reports_after: int
    ratio: float
    median_excess_ms: float
    cause: str
    last_step: int
    to_end: bool

    def __str__(self) -> str:
        released = "" if self.to_end else f", released after step {self.last_step}"
        return (f"straggler rank {self.rank} confirmed in {self.stage} from step {self.first_step} (named in "
                f"{self.reports} of {self.reports_after} reports since, {self.ratio:.2f}x its group; "
                f"cause: {self.cause}){released}")


class RunSummary(Sink):
    """A sink that keeps counts only (bounded memory whatever the run length). A hang
    answer is no sampled step: it is not counted."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reports = 0
        self._stage_reports: collections.Counter[str] = collections.Counter()
        self._flags: collections.Counter[tuple[int, str]] = collections.Counter()
        self._flag_ratios: dict[tuple[int, str], collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=256))
        self._bottlenecks: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()  # confirmed-verdict status per report
        self._confirmed: dict[tuple[int, str], dict] = {}  # (rank, stage) -> first step, report index, ratio, causes
        self._rank_reports: dict[int, list[int]] = {}  # rank -> [its first confirmed report's index, reports naming it]

    def write(self, report: Report) -> None:
        ref = {s: report.metrics[stage_prefix(s) + "ref_ms"] for s in report.stages}
        with self._lock:
            self.reports += 1
            if report.verdict is not None:
                self._fold_verdict(report)
            if report.likely_bottleneck:
                self._bottlenecks[report.likely_bottleneck] += 1
            for j, stage in enumerate(report.stages):
                self._stage_reports[stage] += 1
                for rank in report.stragglers.get(stage, ()):
                    self._flags[(rank, stage)] += 1
                    t = report.judged_ms[rank, j]
                    if ref[stage] > 0 and t > 0:
                        late = is_communication(stage)  # the rule's direction (docs/METRICS.md)
                        self._flag_ratios[(rank, stage)].append(ref[stage] / t if late else t / ref[stage])

    def write_hang(self, event: HangEvent) -> None:
        pass  # no sampled step (class docstring)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Nothing to release: the counts stay readable after."""

    def _fold_verdict(self, report: Report) -> None:
        self.statuses[report.verdict.status] += 1
        for rank in {f.rank for f in report.verdict.findings if f.state == "straggler" and f.rank >= 0}:
            self._rank_reports.setdefault(rank, [self.reports, 0])[1] += 1
        for f in report.verdict.findings:
            if f.state != "straggler" or f.rank < 0:
                continue
            entry = self._confirmed.setdefault((f.rank, f.stage), {
                "first_step": f.since_step, "first_report": self.reports, "reports": 0,
                "ratio": f.ratio, "excess": collections.deque(maxlen=256), "causes": collections.Counter()})
            entry["reports"] += 1
            entry["last_step"], entry["last_report"] = report.step, self.reports
            entry["ratio"] = f.ratio
            entry["excess"].append(f.facts.excess_ms)
            entry["causes"][f.cause] += 1

    def confirmed(self) -> list[Confirmed]:
        """Every (rank, stage) the confirmed verdict named a straggler: those the run's last
        report still names first, then most reports, then the largest excess (what costs the
        job most)."""
        with self._lock:
            out = [Confirmed(rank, stage, e["first_step"], e["reports"], self.reports - e["first_report"] + 1,
                             float(e["ratio"]), float(np.median(e["excess"])),
                             e["causes"].most_common(1)[0][0], e["last_step"], e["last_report"] == self.reports)
                   for (rank, stage), e in self._confirmed.items()]
        return sorted(out, key=lambda c: (not c.to_end, -c.reports, -c.median_excess_ms, c.first_step))

    def lead(self) -> Optional[Confirmed]:
        """The (rank, stage) the headline is about: of the first rank of confirmed(), the stage
        where it costs most (largest excess); None when nobody was confirmed."""
        return _lead(self.confirmed())

    def headline(self) -> str:
        """The run's one-line verdict about lead()'s rank: from its first confirmation (the
        reports naming it in any stage, of those since), the stage where it costs most (until
        when, if released before the rank's last naming), its other stages, and when the verdict
        released it if the run's last report named it in none."""
        confirmed = self.confirmed()
        worst = _lead(confirmed)
        if worst is None:
            return f"no straggler confirmed in {self.reports} reports"
        rank = worst.rank
        mine = [c for c in confirmed if c.rank == rank]
        first = min(mine, key=lambda c: c.first_step)
        with self._lock:
            since, named = self._rank_reports[rank]
            reports_after = self.reports - since + 1
        others = [c.stage for c in mine if c != worst]
        also = f"; also in {', '.join(others)}" if others else ""
        ongoing, last = any(c.to_end for c in mine), max(c.last_step for c in mine)
        until = f" until step {worst.last_step}" if not worst.to_end and worst.last_step < last else ""
        released = "" if ongoing else f"; released after step {last}"
        return (f"straggler rank {rank} confirmed from step {first.first_step} (named in {named} of "
                f"{reports_after} reports since), costing most in {worst.stage}{until}: {worst.ratio:.2f}x its "
                f"group, +{worst.median_excess_ms:.1f} ms{also}; cause: {worst.cause}{released}")

    def flags(self) -> list[Flag]:
        """(rank, stage) pairs ever flagged by the per-step rule, most often flagged first."""
        with self._lock:
            return [Flag(rank, stage, n, self._stage_reports[stage],
                         float(np.median(self._flag_ratios[(rank, stage)])) if self._flag_ratios[(rank, stage)]
                         else float("nan"))
                    for (rank, stage), n in self._flags.most_common()]

    def top(self) -> Optional[Flag]:
        found = self.flags()
        return found[0] if found else None

    def bottlenecks(self) -> dict[str, int]:
        with self._lock:
            return dict(self._bottlenecks.most_common())

    def __repr__(self) -> str:
        return "RunSummary()"


def _lead(confirmed: list[Confirmed]) -> Optional[Confirmed]:
    """RunSummary.lead() of an already built confirmed() list."""
    if not confirmed:
        return None
    return max((c for c in confirmed if c.rank == confirmed[0].rank), key=lambda c: c.median_excess_ms)

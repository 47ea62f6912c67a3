"""The oracle for "nobody confirmed" on a real run: what the raw stage times say.

Ranks sharing 2 cores with whatever else the machine runs are not alike: a rank whose core
the scheduler (or a hyper-thread sibling) keeps busy is really slower, for as long as that
lasts, and confirming it is the verdict's job, not a false alarm. So a healthy phase is not
asserted to confirm nobody; it is asserted to confirm nobody the times do not show slow.
The evidence is the reports' own `device_ms` (each rank's time per stage on the sampled
step), independent of the verdict's statistics: over the reports that led to a
confirmation (the verdict's history), the median of the rank's time over its peers' median
in that stage. A confirmation is founded when that median ratio is at least MIN_RATIO (in a
communication stage also at most 1 / MIN_RATIO: a rank that arrives late waits less than its
peers) or when its cause is host contention (the rank's measured run-queue wait explains it,
tests/python/test_run_queue.py).

An imbalance (a whole comparison group slower than the others) is founded when, over the
reports that confirmed it (CONFIRM_REPORTS in a row), the median of its group's time less
its slowest rank (one slow rank is a straggler, not its group's imbalance) over the median
of the other groups' ranks is at least MIN_RATIO.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional, Sequence

MIN_RATIO = 1.05  # the smallest slowdown called real: 5 % over the peers' median
HISTORY = 8  # reports a confirmation looks back on (ConfirmConfig.history)
CONFIRM_REPORTS = 3  # reports in a row that confirm (ConfirmConfig.confirm_reports)


def _stage_column(report: dict, stage: str) -> list[float]:
    s = report["stages"].index(stage)
    return [row[s] if row[s] is not None else math.nan for row in report["device_ms"]]


def _peer_median(row: Sequence[float], peers: Sequence[int]) -> float:
    times = [row[p] for p in peers if math.isfinite(row[p])]
    return statistics.median(times) if times else math.nan


def median_ratio(reports: Sequence[dict], upto: int, rank: int, stage: str, group: Sequence[int],
                 since: int = 0) -> float:
    """Median over reports[max(upto - HISTORY + 1, since) .. upto] of rank's time in `stage`
    over the median of its group's other ranks (NaN where no report has both)."""
    ratios = []
    for r in reports[max(0, since, upto - HISTORY + 1):upto + 1]:
        if stage not in r["stages"]:
            continue
        column = _stage_column(r, stage)
        ref = _peer_median(column, [p for p in group if p != rank])
        if math.isfinite(column[rank]) and ref > 0:
            ratios.append(column[rank] / ref)
    return statistics.median(ratios) if ratios else math.nan


def slow_in(reports: Sequence[dict], rank: int, stages: Sequence[str], peers: Sequence[int],
            ratio: float) -> list[bool]:
    """Per report: whether `rank`'s time summed over `stages` is at least `ratio` times the
    median of its `peers`' sums (False where a stage is missing or not finite)."""
    out = []
    for r in reports:
        if not all(stage in r["stages"] for stage in stages):
            out.append(False)
            continue
        sums = [sum(_stage_column(r, stage)[p] for stage in stages) for p in range(len(r["device_ms"]))]
        ref = _peer_median(sums, peers)
        out.append(bool(math.isfinite(sums[rank]) and ref > 0 and sums[rank] >= ratio * ref))
    return out


def unfounded(reports: Sequence[dict], groups: Optional[Sequence[Sequence[int]]] = None) -> list[tuple]:
    """(step, rank, stage, cause, median ratio) of every confirmed finding in `reports` (JSONL
    reports: step, stages, device_ms, verdict.findings) that the raw times do not support.
    groups: the comparison groups as rank lists (default: all ranks, one group)."""
    out = []
    for i, r in enumerate(reports):
        for f in r["verdict"]["findings"]:
            if f["state"] != "straggler" or f["cause"] == "host_contention":
                continue
            group = next((g for g in groups if f["rank"] in g), []) if groups else range(len(r["device_ms"]))
            x = median_ratio(reports, i, f["rank"], f["stage"], list(group))
            late = f["stage"].startswith("communication") and x <= 1.0 / MIN_RATIO
            if not (x >= MIN_RATIO or late):
                out.append((r["step"], f["rank"], f["stage"], f["cause"], round(x, 3)))
    return out


def unfounded_imbalances(reports: Sequence[dict], groups: Sequence[Sequence[int]]) -> list[tuple]:
    """(step, group, stage, median ratio) of every imbalance finding in `reports` that the raw
    times do not support; groups: the comparison groups as rank lists, in group order."""
    out = []
    for i, r in enumerate(reports):
        for f in r["verdict"]["findings"]:
            if f["state"] != "imbalance":
                continue
            ratios = []
            for q in reports[max(0, i - CONFIRM_REPORTS + 1):i + 1]:
                column = _stage_column(q, f["stage"])
                own = sorted(column[p] for p in groups[f["group"]] if math.isfinite(column[p]))[:-1]
                others = [column[p] for g, ranks in enumerate(groups) if g != f["group"] for p in ranks
                          if math.isfinite(column[p])]
                if own and others:
                    ratios.append(statistics.median(own) / statistics.median(others))
            x = statistics.median(ratios) if ratios else math.nan
            if not x >= MIN_RATIO:
                out.append((r["step"], f["group"], f["stage"], round(x, 3)))
    return out

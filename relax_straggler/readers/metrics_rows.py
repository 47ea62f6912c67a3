"""megatron_metrics rows (relax_straggler.stores.base.Sample) -> StepTimes, and a
Source over a store's iteration range, so relax_straggler.analysis.engine.analyze() runs on
the rows of a live job exactly as on a recorded file.

Per iteration: one StepTimes row per rank that reported, ranks ascending. A row's time is
the sum of its metric_values (ms; one value in practice, several when a timer ran per
microbatch); rows of one (rank, timer) with different subnames add up. Timer names map
through relax_straggler.readers.megatron_names.timer_target (stage and p2p columns; the
vocabulary of relax_straggler.megatron_timers, ``straggler/<stage>`` included, which the live
sink and the replay write for a stage without a Megatron timer); step_ms is the largest
first value of the iteration's interval-time rows.

Problems carry no file line: each names job, iteration, rank and timer (line 0):
unknown timer names (once per name, every row counted), empty / non-finite / negative
values and repeated (rank, timer, subname) rows (the row is skipped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional

import numpy as np

from relax_straggler.stores.base import STEP_METRIC, Sample, Store
from relax_straggler.readers.base import P2P_OPS, InputError, Problems, StepTimes, empty_stage_row
from relax_straggler.topology import Topology
from relax_straggler.readers.megatron_names import TimerTarget, timer_target

FORMAT = "megatron-metrics"


@dataclass
class RowConverter:
    """Turns rows ordered by iteration into StepTimes, one per iteration.

    job: named in problems. problems: where bad rows are reported. nodes: rank -> node
    name, filled from the rows (the last non-empty name seen for a rank wins).
    unknown / excluded: rows per unknown / known-but-not-a-stage timer name."""

    job: str
    problems: Problems
    nodes: dict[int, str] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    records: int = 0
    _targets: dict = field(default_factory=dict)

    def steps(self, rows: Iterable[Sample]) -> Iterator[StepTimes]:
        """StepTimes per iteration of `rows` (ordered by iteration; rows of one iteration
        may come in any rank order). Iterations without any usable stage row yield nothing."""
        current: Optional[int] = None
        batch: list[Sample] = []
        for row in rows:
            self.records += 1
            if row.iteration != current:
                if batch:
                    step = self._convert(current, batch)
                    if step is not None:
                        yield step
                current, batch = row.iteration, []
            batch.append(row)
        if batch:
            step = self._convert(current, batch)
            if step is not None:
                yield step

    def _target(self, row: Sample) -> Optional[TimerTarget]:
        name = row.metric_name
        if name not in self._targets:
            self._targets[name] = timer_target(name)
            if self._targets[name] is None:
                self.problems.report(0, f"{self._where(row)}: unknown timer name {name!r} (not a Megatron timer "
                                        "name; see docs/ANALYZE.md for the mapping)", "unknown_op")
        target = self._targets[name]
        if target is None:
            self.unknown[name] = self.unknown.get(name, 0) + 1
        elif target.stage is None and name != STEP_METRIC:
            self.excluded[name] = self.excluded.get(name, 0) + 1
        return target

    def _convert(self, iteration: int, rows: list[Sample]) -> Optional[StepTimes]:
        seen: set[tuple[int, str, str]] = set()
        kept: list[tuple[int, float, TimerTarget]] = []
        step_ms = math.nan
        for row in rows:
            if row.node:
                self.nodes[row.rank] = row.node
            target = self._target(row)
            if row.metric_name != STEP_METRIC and (target is None or target.stage is None):
                continue  # unknown or not a stage: counted, and its values are no time of ours
            key = (row.rank, row.metric_name, row.subname)
            if key in seen:
                self.problems.report(0, f"{self._where(row)}: a second row for this rank, timer and subname "
                                        f"{row.subname!r}; skipped", "duplicate")
                continue
            seen.add(key)
            values = row.values
            if not values or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in values):
                self.problems.report(0, f"{self._where(row)}: values {list(values)!r} are not times >= 0 ms; "
                                        "skipped", "bad_value")
                continue
            if row.metric_name == STEP_METRIC:
                step_ms = values[0] if math.isnan(step_ms) else max(step_ms, values[0])
            else:
                kept.append((row.rank, float(sum(values)), target))
        if not kept:
            return None
        ranks = np.array(sorted({r for r, _, _ in kept}), dtype=np.int64)
        row_of = {int(r): i for i, r in enumerate(ranks)}
        ms = empty_stage_row(ranks.size)
        p2p = np.full((ranks.size, len(P2P_OPS)), np.nan) if any(t.p2p is not None for _, _, t in kept) else None
        for rank, value, target in kept:
            i = row_of[rank]
            ms[i, target.stage] = value if math.isnan(ms[i, target.stage]) else ms[i, target.stage] + value
            if target.p2p is not None:
                p2p[i, target.p2p] = value if math.isnan(p2p[i, target.p2p]) else p2p[i, target.p2p] + value
        return StepTimes(step=iteration, ranks=ranks, ms=ms, p2p_ms=p2p, step_ms=step_ms)

    def _where(self, row: Sample) -> str:
        return f"job {self.job!r} iteration {row.iteration} rank {row.rank} timer {row.metric_name!r}"


class StoreSource:
    """A readers.base.Source over the rows of `job` in [first_iteration, last_iteration]
    not older than `since` (s since the epoch) in `store`.

    topology: the job's layout when registered with one (dp/pp/tp, ranks_per_node); else
    None and analyze() compares every rank with every other (flat). nodes (rank -> node
    name) is complete once steps() is exhausted. Raises StoreError from steps() when the
    store fails, InputError when the range has no usable row."""

    format = FORMAT

    def __init__(self, store: Store, job: str, first_iteration: int, last_iteration: int, since: float = 0.0,
                 topology: Optional[Topology] = None, strict: bool = False) -> None:
        self.store, self.job = store, job
        self.first_iteration, self.last_iteration, self.since = first_iteration, last_iteration, since
        self.path = f"{store.url} job {job} iterations {first_iteration}-{last_iteration}"
        self.problems = Problems(self.path, strict=strict)
        self._topology = topology
        self.converter = RowConverter(job, self.problems)
        self.total_bytes = 0
        self.done_bytes = 0

    @property
    def records(self) -> int:
        return self.converter.records

    @property
    def nodes(self) -> dict[int, str]:
        return self.converter.nodes

    @property
    def names(self) -> "StoreSource":
        """For the summary's excluded / unknown op counts (the readers' OpNames shape)."""
        return self

    @property
    def excluded(self) -> dict[str, int]:
        return self.converter.excluded

    @property
    def unknown(self) -> dict[str, int]:
        return self.converter.unknown

    def topology(self) -> Optional[Topology]:
        return self._topology

    def steps(self) -> Iterator[StepTimes]:
        count = 0
        rows = self.store.samples(self.job, self.first_iteration, self.last_iteration, since=self.since)
        for step in self.converter.steps(rows):
            count += 1
            yield step
        if count == 0:
            first = f"; first problem: {self.problems.kept[0]}" if self.problems.kept else ""
            raise InputError(f"{self.path}: no usable row ({self.records} rows read){first}")

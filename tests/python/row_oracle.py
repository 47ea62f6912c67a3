"""The trusted reference of the store-row conversion: megatron_metrics rows turned into
StepTimes one Sample at a time, in plain Python, with the rules of
relax_straggler.readers.metrics_rows (its numpy path over tables must give the same steps,
problems and counts)."""

from __future__ import annotations

import math
from typing import Iterable, Iterator, Optional

import numpy as np

from relax_straggler.readers.base import MAX_TIME_MS, P2P_OPS, StepTimes, empty_stage_row
from relax_straggler.readers.megatron_names import TimerTarget, timer_target
from relax_straggler.readers.metrics_rows import RowConverter
from relax_straggler.stores.base import STEP_METRIC, Sample


class RowOracle(RowConverter):
    """RowConverter whose steps() converts row by row."""

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
                                        "name; see docs/ANALYZE.md for the mapping)", "unknown_op", skipped=0)
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
            if not values or not all(isinstance(v, (int, float)) and 0 <= v <= MAX_TIME_MS for v in values):
                self.problems.report(0, f"{self._where(row)}: values {list(values)!r} are not times in "
                                        f"[0, {MAX_TIME_MS:g}] ms; skipped", "bad_value")
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

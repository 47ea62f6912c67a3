"""megatron_metrics rows (relax_straggler.stores.base.Sample) -> StepTimes, and a
Source over a store's iteration range, so relax_straggler.analysis.engine.analyze() runs on
the rows of a live job exactly as on a recorded file.

Per iteration: one StepTimes row per rank that reported, ranks ascending. A row's time is
the sum of its metric_values (ms; one value in practice, several when a timer ran per
microbatch); rows of one (rank, timer) with different subnames add up. Timer names map
through relax_straggler.readers.megatron_names.timer_target (stage and p2p columns; the
vocabulary of relax_straggler.common.megatron_timers, ``straggler/<stage>`` included, which the live
sink and the feed write for a stage without a Megatron timer); step_ms is the largest
first value of the iteration's interval-time rows.

Problems carry no file line: each names job, iteration, rank and timer (line 0):
unknown timer names (once per name, every row counted), empty, non-finite, negative or
absurd (beyond MAX_TIME_MS) values and repeated (rank, timer, subname) rows (the row is skipped).

Rows the store lists but cannot deliver (a damaged frame of the file store, skipped by the
store) are found by a cross-check with the store's own per-iteration account
(Store.iterations: ranks with a step-time row): an iteration of the range whose step-time
rows read are fewer than it lists was not read whole, and is reported and counted in
Problems.steps_lost of steps_listed (readers/base.py: past a tenth, no verdict).

The conversion runs over SAMPLE_SCHEMA tables, column by column in numpy (no Python object
per row): RowConverter.table_steps, which StoreSource reads through Store.tables; Samples
(RowConverter.steps) go through it in tables of ROWS_PER_TABLE rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import islice
from typing import Iterable, Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.common.topology import Topology
from relax_straggler.readers.base import MAX_TIME_MS, P2P_OPS, InputError, Problems, StepTimes, empty_stage_row
from relax_straggler.readers.megatron_names import timer_target
from relax_straggler.stores.base import STEP_METRIC, IterationTime, Sample, Store, samples_to_table

FORMAT = "megatron-metrics"
ROWS_PER_TABLE = 65_536


@dataclass
class RowConverter:
    """Turns rows ordered by iteration into StepTimes, one per iteration.

    job: named in problems. problems: where bad rows are reported. nodes: rank -> node
    name, filled from the rows (the last non-empty name seen for a rank wins).
    unknown / excluded: rows per unknown / known-but-not-a-stage timer name. step_rows:
    iteration -> its STEP_METRIC rows with a value, repeats included (what the store's
    per-iteration account is checked against)."""

    job: str
    problems: Problems
    nodes: dict[int, str] = field(default_factory=dict)
    unknown: dict[str, int] = field(default_factory=dict)
    excluded: dict[str, int] = field(default_factory=dict)
    step_rows: dict[int, int] = field(default_factory=dict)
    records: int = 0
    _targets: dict = field(default_factory=dict)

    def steps(self, rows: Iterable[Sample]) -> Iterator[StepTimes]:
        """StepTimes per iteration of `rows` (ordered by iteration; rows of one iteration
        may come in any rank order), through table_steps in tables of ROWS_PER_TABLE rows.
        Iterations without any usable stage row yield nothing."""
        return self.table_steps(_tables(rows))

    def table_steps(self, tables: Iterable[pa.Table]) -> Iterator[StepTimes]:
        """steps() over SAMPLE_SCHEMA tables (rows ordered by iteration; an iteration may
        continue in the next table): the same StepTimes, problems (in the same order) and
        counts, computed column by column."""
        held: Optional[pa.Table] = None  # the last iteration seen, which the next table may continue
        for table in tables:
            if table.num_rows == 0:
                continue
            table = table if held is None else pa.concat_tables([held, table])
            its = table.column("iteration").to_numpy()
            last = int(np.flatnonzero(its != its[-1]).max(initial=-1)) + 1
            if last:
                yield from self._convert_table(table.slice(0, last))
            held = table.slice(last)
        if held is not None:
            yield from self._convert_table(held)

    def _convert_table(self, table: pa.Table) -> Iterator[StepTimes]:
        """StepTimes of each run of equal iterations of `table` (_convert's rules)."""
        n = table.num_rows
        self.records += n
        table = table.combine_chunks()
        its = table.column("iteration").to_numpy()
        ranks = table.column("rank").to_numpy().astype(np.int64)
        names = pc.dictionary_encode(table.column("metric_name")).chunk(0)
        name_of, codes = names.dictionary.to_pylist(), names.indices.to_numpy()
        # Per timer name: its target; a name never seen before that is unknown is reported
        # at its first row (as _target does), in row order with the other problems.
        stage_of = np.full(len(name_of), -1, np.int64)
        p2p_of = np.full(len(name_of), -1, np.int64)
        first_unknown: list[int] = []
        counts = np.bincount(codes, minlength=len(name_of))
        for code, name in enumerate(name_of):
            if counts[code] == 0:
                continue
            if name not in self._targets:
                self._targets[name] = timer_target(name)
                if self._targets[name] is None:
                    first_unknown.append(int(np.argmax(codes == code)))
            target = self._targets[name]
            if target is None:
                self.unknown[name] = self.unknown.get(name, 0) + int(counts[code])
                continue
            if target.stage is None and name != STEP_METRIC:
                self.excluded[name] = self.excluded.get(name, 0) + int(counts[code])
            stage_of[code] = -1 if target.stage is None else target.stage
            p2p_of[code] = -1 if target.p2p is None else target.p2p
        step_code = name_of.index(STEP_METRIC) if STEP_METRIC in name_of else -1
        is_step = codes == step_code
        stage, p2p = stage_of[codes], p2p_of[codes]
        considered = is_step | (stage >= 0)
        # Runs of one iteration; a repeated (rank, timer, subname) within a run is a duplicate.
        run = np.concatenate(([0], np.cumsum(its[1:] != its[:-1])))
        subnames = pc.dictionary_encode(table.column("subname")).chunk(0).indices.to_numpy()
        rows = np.flatnonzero(considered)
        order = rows[np.lexsort((rows, subnames[rows], codes[rows], ranks[rows], run[rows]))]
        keys = np.stack([run[order], ranks[order], codes[order], subnames[order]])
        duplicate = np.zeros(n, bool)
        duplicate[order[1:][(keys[:, 1:] == keys[:, :-1]).all(axis=0)]] = True
        # Values: a row's sum (in order, as sum() adds) and first value; a bad row has none,
        # or one that is not finite or negative.
        values = table.column("metric_values").chunk(0)
        flat = values.flatten().to_numpy(zero_copy_only=False)
        parents = pc.list_parent_indices(values).to_numpy()
        lengths = pc.list_value_length(values).to_numpy(zero_copy_only=False)
        bad_value = (lengths == 0) | (np.bincount(parents, weights=~((flat >= 0) & (flat <= MAX_TIME_MS)) * 1.0,
                                                  minlength=n) > 0)
        sums = np.bincount(parents, weights=flat, minlength=n)
        firsts = np.full(n, np.nan)
        offsets = values.offsets.to_numpy()
        starts = offsets[:-1] - offsets[0]  # a slice's offsets start where its values do
        firsts[lengths > 0] = flat[starts[lengths > 0]]
        step_its, step_counts = np.unique(its[is_step & (lengths > 0)], return_counts=True)
        for it, c in zip(step_its.tolist(), step_counts.tolist()):
            self.step_rows[it] = self.step_rows.get(it, 0) + c
        bad_value &= considered & ~duplicate
        good = considered & ~duplicate & ~bad_value
        kept, step_rows = good & ~is_step, good & is_step
        problem_rows = np.zeros(n, bool)
        problem_rows[first_unknown] = True
        problem_rows |= duplicate | bad_value
        nodes = pc.dictionary_encode(table.column("node")).chunk(0)
        node_of, node_codes = nodes.dictionary.to_pylist(), nodes.indices.to_numpy()
        named = node_codes != (node_of.index("") if "" in node_of else -1)
        bounds = np.flatnonzero(np.diff(run)) + 1
        for lo, hi in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [n]))):
            self._note_nodes(ranks[lo:hi], node_codes[lo:hi], named[lo:hi], node_of)
            for i in lo + np.flatnonzero(problem_rows[lo:hi]):
                self._report_row(table, int(i), name_of[codes[i]], bool(duplicate[i]), bool(bad_value[i]))
            k = lo + np.flatnonzero(kept[lo:hi])
            if k.size == 0:
                continue
            step_values = firsts[lo:hi][step_rows[lo:hi]]
            step_ms = float(step_values.max()) if step_values.size else math.nan
            yield _step(int(its[lo]), ranks[k], stage[k], p2p[k], sums[k], step_ms)

    def _note_nodes(self, ranks: np.ndarray, codes: np.ndarray, named: np.ndarray, node_of: list) -> None:
        """nodes[rank] = the rank's last non-empty node name among these rows."""
        r, c = ranks[named][::-1], codes[named][::-1]
        unique, first = np.unique(r, return_index=True)
        for rank, code in zip(unique.tolist(), c[first].tolist()):
            self.nodes[rank] = node_of[code]

    def _report_row(self, table: pa.Table, i: int, name: str, duplicate: bool, bad_value: bool) -> None:
        """Reports the problem of row `i` of a table: a repeated (rank, timer, subname), values
        that are no times, or (at a name's first row) an unknown timer name."""
        row = Sample(0.0, self.job, name, int(table.column("rank")[i].as_py()),
                     int(table.column("iteration")[i].as_py()), tuple(table.column("metric_values")[i].as_py()),
                     subname=table.column("subname")[i].as_py())
        if duplicate:
            self.problems.report(0, f"{self._where(row)}: a second row for this rank, timer and subname "
                                    f"{row.subname!r}; skipped", "duplicate")
        elif bad_value:
            self.problems.report(0, f"{self._where(row)}: values {list(row.values)!r} are not times in "
                                    f"[0, {MAX_TIME_MS:g}] ms; skipped", "bad_value")
        else:
            self.problems.report(0, f"{self._where(row)}: unknown timer name {name!r} (not a Megatron timer "
                                    "name; see docs/ANALYZE.md for the mapping)", "unknown_op", skipped=0)

    def _where(self, row: Sample) -> str:
        return f"job {self.job!r} iteration {row.iteration} rank {row.rank} timer {row.metric_name!r}"


def _tables(rows: Iterable[Sample]) -> Iterator[pa.Table]:
    """`rows` as SAMPLE_SCHEMA tables of at most ROWS_PER_TABLE rows each."""
    it = iter(rows)
    while chunk := list(islice(it, ROWS_PER_TABLE)):
        yield samples_to_table(chunk)


def _step(iteration: int, ranks: np.ndarray, stages: np.ndarray, p2p: np.ndarray, values: np.ndarray,
          step_ms: float) -> StepTimes:
    """One iteration's StepTimes from its kept rows (rank, stage column, p2p column or -1,
    ms): times of one rank and column add up, in row order; NaN where none."""
    unique, row = np.unique(ranks, return_inverse=True)
    ms = empty_stage_row(unique.size)
    _add(ms, row, stages, values)
    with_p2p = p2p >= 0
    p2p_ms = None
    if with_p2p.any():
        p2p_ms = np.full((unique.size, len(P2P_OPS)), np.nan)
        _add(p2p_ms, row[with_p2p], p2p[with_p2p], values[with_p2p])
    return StepTimes(step=iteration, ranks=unique.astype(np.int64), ms=ms, p2p_ms=p2p_ms, step_ms=step_ms)


def _add(out: np.ndarray, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
    """out[rows, cols] = the sum of values there (NaN cells: the first value), in order."""
    seen = np.zeros(out.shape, bool)
    seen[rows, cols] = True
    out[seen] = 0.0
    np.add.at(out, (rows, cols), values)


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
        listed = [it for it in self.store.iterations(self.job, self.first_iteration - 1, since=self.since)
                  if it.iteration <= self.last_iteration]
        tables = self.store.tables(self.job, self.first_iteration, self.last_iteration, since=self.since)
        for step in self.converter.table_steps(tables):
            count += 1
            yield step
        self._check_listed(listed)
        if count == 0:
            first = f"; first problem: {self.problems.kept[0]}" if self.problems.kept else ""
            raise InputError(f"{self.path}: no usable row ({self.records} rows read){first}")

    def _check_listed(self, listed: list[IterationTime]) -> None:
        """Reports each listed iteration with fewer step-time rows read than the store lists
        (rows the store holds but could not deliver), and counts them in the problems."""
        self.problems.steps_listed += len(listed)
        for it in listed:
            read = self.converter.step_rows.get(it.iteration, 0)
            if read < it.ranks:
                self.problems.steps_lost += 1
                self.problems.report(0, f"job {self.job!r} iteration {it.iteration}: the store lists step-time rows "
                                        f"of {it.ranks} ranks, {read} could be read (damaged or missing rows); the "
                                        "iteration is " + ("missing" if read == 0 else "incomplete"),
                                     "unreadable", skipped=0)

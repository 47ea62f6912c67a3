"""Per-operation parquet traces (the what-if analysis layout, OSDI'25 artifact).

One row per operation with columns dp_rank, stage (pipeline rank), step, optype (a
Megatron timer name), duration (seconds), and optionally rank (global rank; without it
each worker is one rank), start_ts (seconds, gives the step's wall time), seq_id and mc
(model chunk of a virtual pipeline; both make the duplicate key). Read in record batches
with pyarrow, so memory does not grow with the file (op_trace.py).

Each row's dp_rank and stage place its rank; the layout follows from the records
(readers/layout.py), so any rank order and context / sequence-data parallel ranks work.

Row problems, each reported with its 1-based row number: NaN, negative or absurd (beyond
MAX_TIME_S) durations and start times, null optypes, ids that are null, not integers or out
of range (dp_rank, stage, rank below MAX_WORLD_SIZE; step in int64; seq_id, mc, mb_id -1 or
in int32), ids outside the declared layout, a rank that changes its (dp_rank, stage),
duplicate rows (same rank, step, optype, seq_id, mc), unknown op names. A column of any
type but integer or floating point (numbers as strings too) refuses the file.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology
from relax_straggler.readers.arrow_values import nulls, values
from relax_straggler.readers.base import MAX_SMALL_ID, MAX_STEP, MAX_TIME_S, InputError, Problems, StepTimes, check_dense
from relax_straggler.readers.layout import out_of_bounds, resolve_layout
from relax_straggler.readers.op_records import OpCollector, OpRecords, Placement
from relax_straggler.readers.op_trace import (DuplicateFilter, KeyIndex, OpNames, StepAccumulator, load_meta,
                                              meta_path_for, row_keys)

REQUIRED = ("dp_rank", "stage", "step", "optype", "duration")
OPTIONAL = ("rank", "start_ts", "seq_id", "mc", "mb_id")
# Integer columns -> the values a row may hold (-1: none); a row outside is reported and skipped.
_ID_RANGE = {"dp_rank": (0, MAX_WORLD_SIZE - 1), "stage": (0, MAX_WORLD_SIZE - 1), "rank": (0, MAX_WORLD_SIZE - 1),
             "step": (0, MAX_STEP), "seq_id": (-1, MAX_SMALL_ID), "mc": (-1, MAX_SMALL_ID), "mb_id": (-1, MAX_SMALL_ID)}
_WORKER_BASE = 1 << 20  # rank key of a worker when the trace has no rank column
BATCH_ROWS = 1 << 16


class ParquetTraceReader:
    format = "parquet-trace"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None, ops: bool = False) -> None:
        self.path = path
        self._ops = OpCollector() if ops else None
        self._placement = Placement.empty()
        self.problems = problems
        try:
            self._file = pq.ParquetFile(path)
        except (OSError, pa.ArrowException, UnicodeDecodeError) as exc:  # the last: damaged column names
            raise InputError(f"{path}: not a readable parquet file: {exc}") from None
        names = set(self._file.schema_arrow.names)
        missing = [c for c in REQUIRED if c not in names]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}; a per-op trace needs "
                             f"{', '.join(REQUIRED)} (found: {', '.join(sorted(names))})")
        self._columns = list(REQUIRED) + [c for c in OPTIONAL if c in names]
        meta = meta or meta_path_for(path)
        self._topology = topology or (load_meta(meta) if meta else None)
        self.total_bytes = os.path.getsize(path)
        self.done_bytes = 0
        self.records = 0
        self.names = OpNames(problems)
        self._name_ids: dict[str, int] = {}

    def topology(self) -> Optional[Topology]:
        return self._topology

    def op_records(self) -> Optional[OpRecords]:
        """The valid ops once steps() has been exhausted; None unless opened with ops=True."""
        return None if self._ops is None else self._ops.records(self._placement)

    def _column(self, batch: pa.RecordBatch, name: str) -> pa.Array:
        """A numeric column, dictionary-decoded. Raises InputError for any other type (a string
        column of numbers is refused, not parsed)."""
        col = batch.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
            raise InputError(f"{self.path}: column {name!r} of type {col.type} is not numeric")
        return col

    def _floats(self, batch: pa.RecordBatch, name: str) -> np.ndarray:
        """(rows,) float64 values, NaN for nulls."""
        col = self._column(batch, name)
        out = values(col).astype(np.float64)
        out[nulls(col)] = np.nan
        return out

    def _ids(self, batch: pa.RecordBatch, name: str, valid: np.ndarray, first_row: int) -> np.ndarray:
        """(rows,) int64 ids of an integer column (_ID_RANGE); a row whose value is null, not
        an integer or out of range is reported and cleared from `valid` (its id reads 0)."""
        col = self._column(batch, name)
        lo, hi = _ID_RANGE[name]
        null = nulls(col)
        raw = np.where(null, 0, values(col))
        with np.errstate(invalid="ignore"):
            if raw.dtype.kind == "f":
                bad = null | ~np.isfinite(raw) | (raw != np.floor(raw)) | ~(raw >= lo) | ~(raw < float(hi) + 1)
            else:
                bad = null | (raw > hi) | ((raw < lo) if raw.dtype.kind == "i" else False)
        ids = np.where(bad, 0, raw).astype(np.int64)
        for i in np.flatnonzero(valid & bad).tolist():
            value = "null" if null[i] else (repr(float(raw[i])) if raw.dtype.kind == "f" else str(int(raw[i])))
            self.problems.report(first_row + i + 1, f"{name} {value} is not an integer in [{lo}, {hi:,}]",
                                 "bad_value")
        valid &= ~bad
        return ids

    def _bad_rows(self, mask: np.ndarray, first_row: int, message: str, kind: str) -> None:
        for i in np.flatnonzero(mask).tolist():
            self.problems.report(first_row + i + 1, message, kind=kind)

    def steps(self) -> Iterator[StepTimes]:
        acc = StepAccumulator(self.path)
        dups = DuplicateFilter()
        first_row = 0
        per_row = self.total_bytes / max(1, self._file.metadata.num_rows)
        places = _Places()
        try:
            batches = self._file.iter_batches(batch_size=BATCH_ROWS, columns=self._columns)
            for batch in batches:
                n = batch.num_rows
                self._add_batch(batch, first_row, acc, dups, places)
                first_row += n
                self.records = first_row
                self.done_bytes = int(first_row * per_row)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{self.path}:{first_row + 1}: cannot read rows from here on: {exc}") from None
        except UnicodeDecodeError as exc:  # damaged bytes in a string column
            raise InputError(f"{self.path}:{first_row + 1}: the rows from here on have a string that is not UTF-8 "
                             f"({exc.reason})") from None
        self.done_bytes = self.total_bytes
        keys, dps, pps, rows = places.arrays()
        if "rank" in self._columns:
            self._topology = resolve_layout(self.path, keys, dps, pps, rows, self._topology, acc.num_steps,
                                            self.records)
            self._placement = Placement(keys, dps, pps, keys)
            yield from acc.steps()
            return
        # One rank per worker, numbered by the formula of the declared (or inferred) layout.
        if not keys.size:
            raise InputError(f"{self.path}: no usable operation rows")
        if self._topology is None:
            dp, pp = int(dps.max()) + 1, int(pps.max()) + 1
            what = "the layout of the recorded dp_rank and stage ids"
            check_dense(self.path, acc.num_steps, dp * pp, self.records, what)
            if dp * pp > MAX_WORLD_SIZE:
                raise InputError(f"{self.path}: dp_rank up to {dp - 1} and stage up to {pp - 1} ({what}): {dp * pp:,} "
                                 f"workers are beyond the {MAX_WORLD_SIZE:,} ranks a job may have")
            self._topology = Topology(dp=dp, pp=pp)
        else:
            check_dense(self.path, acc.num_steps, self._topology.world_size, self.records, "the declared layout")
        ranks = np.asarray(self._topology.rank_of(dps, pps, 0), dtype=np.int64)
        self._placement = Placement(keys, dps, pps, ranks)
        yield from acc.steps(keys, ranks)

    def _add_batch(self, batch: pa.RecordBatch, first_row: int, acc: StepAccumulator, dups: DuplicateFilter,
                   places: "_Places") -> None:
        n = batch.num_rows
        duration_ms = self._floats(batch, "duration") * 1e3
        start_ms = self._floats(batch, "start_ts") * 1e3 if "start_ts" in self._columns else None
        optype = batch.column("optype")
        if not pa.types.is_dictionary(optype.type):
            optype = optype.dictionary_encode()  # imports pyarrow.compute only for such a file
        names = optype.dictionary.to_pylist()
        indices = optype.indices
        valid = np.ones(n, dtype=bool)
        null = nulls(indices)
        if null.any():
            self._bad_rows(null, first_row, "optype is null", "malformed")
            valid &= ~null
        codes = np.where(null, 0, values(indices)).astype(np.int64)

        bad = valid & ~((duration_ms >= 0) & (duration_ms <= MAX_TIME_S * 1e3))
        self._bad_rows(bad, first_row, f"duration must be a number of seconds in [0, {MAX_TIME_S:g}]", "bad_value")
        valid &= ~bad
        if start_ms is not None:
            bad = valid & ~((start_ms >= 0) & (start_ms <= MAX_TIME_S * 1e3))
            self._bad_rows(bad, first_row, f"start_ts must be a number of seconds in [0, {MAX_TIME_S:g}]", "bad_value")
            valid &= ~bad
        dp = self._ids(batch, "dp_rank", valid, first_row)
        pp = self._ids(batch, "stage", valid, first_row)
        rank = self._ids(batch, "rank", valid, first_row) if "rank" in self._columns else dp * _WORKER_BASE + pp
        step = self._ids(batch, "step", valid, first_row)
        none = np.full(n, -1, np.int64)
        seq, mc, mb = (self._ids(batch, c, valid, first_row) if c in self._columns else none
                       for c in ("seq_id", "mc", "mb_id"))
        valid &= self._check_layout(dp, pp, rank, valid, first_row, places)

        stage = np.full(n, -1, dtype=np.int64)
        p2p = np.full(n, -1, dtype=np.int64)
        known = np.zeros(n, dtype=bool)
        for code, name in enumerate(names):
            rows = codes == code
            count = int(np.count_nonzero(rows & valid))
            if count == 0:
                continue
            target = self.names.resolve(str(name), first_row + int(np.argmax(rows & valid)) + 1, count)
            known[rows] = self.names.known(str(name))
            if target is not None:
                stage[rows] = target.stage
                p2p[rows] = -1 if target.p2p is None else target.p2p
        valid &= known

        # [-1]: the codes of null optypes (skipped rows) index something when no name exists.
        name_ids = np.array([self._name_ids.setdefault(str(x), len(self._name_ids)) for x in names] or [-1],
                            dtype=np.int64)
        keys = row_keys(rank, step, name_ids[codes], seq, mc)
        dup = np.zeros(n, dtype=bool)
        dup[valid] = dups.seen_before(keys[valid])
        self._bad_rows(dup, first_row, "duplicate row (same rank, step, optype, seq_id, mc as an earlier row)",
                       "duplicate")
        valid &= ~dup
        summed = valid & (stage >= 0)
        acc.add(step[summed], rank[summed], stage[summed], p2p[summed], duration_ms[summed],
                None if start_ms is None else start_ms[summed])
        if self._ops is not None:
            start_s = start_ms / 1e3 if start_ms is not None else np.full(n, np.nan)
            self._ops.add(rank[valid], step[valid], self._ops.name_ids([str(x) for x in names])[codes[valid]],
                          start_s[valid], duration_ms[valid] / 1e3, seq[valid], mb[valid], mc[valid])

    def _check_layout(self, dp: np.ndarray, pp: np.ndarray, rank: np.ndarray, valid: np.ndarray, first_row: int,
                      places: "_Places") -> np.ndarray:
        """Rows inside the declared layout (when one is given) whose rank keeps one (dp_rank, stage)."""
        ok = np.ones(rank.shape, dtype=bool)
        topo = self._topology
        if topo is not None:
            bad = valid & out_of_bounds(topo, dp, pp, rank if "rank" in self._columns else np.zeros_like(rank))
            self._bad_rows(bad, first_row, f"dp_rank, stage or rank outside the declared layout (dp {topo.dp}, "
                           f"pp {topo.pp}, tp {topo.tp}, dsp {topo.slots // topo.tp}: {topo.world_size} ranks)",
                           "layout")
            ok &= ~bad
        kept = np.flatnonzero(valid & ok)
        if not kept.size:
            return ok
        # One 64-bit hash per (rank, dp_rank, stage): a 1-D unique is several times faster than axis=0.
        _, first, count = np.unique(row_keys(rank[kept], dp[kept], pp[kept]), return_index=True, return_counts=True)
        # A rank new in this batch takes its most frequent (dp_rank, stage), the earliest on a tie.
        first = kept[first[np.lexsort((first, -count, rank[kept][first]))]]
        lead = first[np.r_[True, rank[first][1:] != rank[first][:-1]]]
        places.place(rank[lead], dp[lead], pp[lead], lead + first_row + 1)
        at = places.index.find(rank[kept])
        moved = kept[(dp[kept] != places.dp[at]) | (pp[kept] != places.pp[at])]
        for i in moved.tolist():
            j = int(places.index.find(rank[i:i + 1])[0])
            self.problems.report(first_row + i + 1, f"rank {int(rank[i])} changes (dp_rank, stage) from "
                                 f"({int(places.dp[j])}, {int(places.pp[j])}) (row {int(places.row[j])})", "layout")
        ok[moved] = False
        return ok


class _Places:
    """Each rank key's (dp_rank, stage) as first recorded and its first 1-based row: arrays
    indexed by a KeyIndex (no Python object per rank)."""

    def __init__(self) -> None:
        self.index = KeyIndex()
        self.dp = np.zeros(0, np.int64)
        self.pp = np.zeros(0, np.int64)
        self.row = np.zeros(0, np.int64)

    def place(self, keys: np.ndarray, dp: np.ndarray, pp: np.ndarray, rows: np.ndarray) -> None:
        """Records the place of each of `keys` (distinct) not placed before."""
        before = len(self.index)
        at = self.index.add(keys)
        new = at >= before
        if new.any():
            grown = len(self.index)
            for name, values in (("dp", dp), ("pp", pp), ("row", rows)):
                column = np.resize(getattr(self, name), grown)
                column[at[new]] = values[new]
                setattr(self, name, column)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(keys ascending, dp_rank, stage, first row) of every placed key."""
        keys = self.index.sorted_keys()
        at = self.index.find(keys)
        return keys, self.dp[at], self.pp[at], self.row[at]

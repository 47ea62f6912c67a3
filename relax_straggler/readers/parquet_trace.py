"""Per-operation parquet traces (the what-if analysis layout, OSDI'25 artifact).

One row per operation with columns dp_rank, stage (pipeline rank), step, optype (a
Megatron timer name), duration (seconds), and optionally rank (global rank; without it
each worker is one rank), start_ts (seconds, gives the step's wall time), seq_id and mc
(model chunk of a virtual pipeline; both make the duplicate key). Read in record batches
with pyarrow, so memory does not grow with the file (op_trace.py).

Each row's dp_rank and stage place its rank; the layout follows from the records
(readers/layout.py), so any rank order and context / sequence-data parallel ranks work.

Row problems, each reported with its 1-based row number: NaN or negative durations,
NaN or negative start times, ids outside the declared layout, a rank that changes its
(dp_rank, stage), duplicate rows (same rank, step, optype, seq_id, mc), unknown op names.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from relax_straggler.readers.base import InputError, Problems, StepTimes
from relax_straggler.readers.layout import out_of_bounds, resolve_layout
from relax_straggler.readers.op_records import OpCollector, OpRecords
from relax_straggler.topology import Topology
from relax_straggler.readers.op_trace import (DuplicateFilter, OpNames, StepAccumulator, load_meta, meta_path_for,
                                              row_keys)

REQUIRED = ("dp_rank", "stage", "step", "optype", "duration")
OPTIONAL = ("rank", "start_ts", "seq_id", "mc", "mb_id")
_WORKER_BASE = 1 << 20  # rank key of a worker when the trace has no rank column
BATCH_ROWS = 1 << 16


class ParquetTraceReader:
    format = "parquet-trace"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None, ops: bool = False) -> None:
        self.path = path
        self._ops = OpCollector() if ops else None
        self._placement: dict[int, tuple[int, int, int]] = {}
        self.problems = problems
        try:
            self._file = pq.ParquetFile(path)
        except (OSError, pa.ArrowException) as exc:
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

    def _numeric(self, batch: pa.RecordBatch, name: str, dtype) -> np.ndarray:
        col = batch.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.dictionary_decode()
        try:
            return col.to_numpy(zero_copy_only=False).astype(dtype)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise InputError(f"{self.path}: column {name!r} of type {col.type} is not numeric: {exc}") from None

    def _bad_rows(self, mask: np.ndarray, first_row: int, message: str, kind: str) -> None:
        for i in np.flatnonzero(mask).tolist():
            self.problems.report(first_row + i + 1, message, kind=kind)

    def steps(self) -> Iterator[StepTimes]:
        acc = StepAccumulator()
        dups = DuplicateFilter()
        first_row = 0
        per_row = self.total_bytes / max(1, self._file.metadata.num_rows)
        layout: dict[int, tuple[int, int]] = {}  # rank key -> (dp_rank, stage)
        first_rows: dict[int, int] = {}  # rank key -> its first 1-based row
        try:
            batches = self._file.iter_batches(batch_size=BATCH_ROWS, columns=self._columns)
            for batch in batches:
                n = batch.num_rows
                self._add_batch(batch, first_row, acc, dups, layout, first_rows)
                first_row += n
                self.records = first_row
                self.done_bytes = int(first_row * per_row)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{self.path}:{first_row + 1}: cannot read rows from here on: {exc}") from None
        self.done_bytes = self.total_bytes
        if "rank" in self._columns:
            self._topology = resolve_layout(self.path, layout, first_rows, self._topology)
            self._placement = {r: (d, p, r) for r, (d, p) in layout.items()}
            yield from acc.steps(self.path)
            return
        # One rank per worker, numbered by the formula of the declared (or inferred) layout.
        workers = {k: (k // _WORKER_BASE, k % _WORKER_BASE) for k in layout}
        if self._topology is None:
            dp = max(d for d, _ in workers.values()) + 1
            self._topology = Topology(dp=dp, pp=max(p for _, p in workers.values()) + 1)
        topo = self._topology
        ranks = {k: int(topo.rank_of(d, p, 0)) for k, (d, p) in workers.items()}
        self._placement = {k: (d, p, ranks[k]) for k, (d, p) in workers.items()}
        yield from acc.steps(self.path, ranks)

    def _add_batch(self, batch: pa.RecordBatch, first_row: int, acc: StepAccumulator, dups: DuplicateFilter,
                   layout: dict[int, tuple[int, int]], first_rows: dict[int, int]) -> None:
        n = batch.num_rows
        dp = self._numeric(batch, "dp_rank", np.int64)
        pp = self._numeric(batch, "stage", np.int64)
        rank = self._numeric(batch, "rank", np.int64) if "rank" in self._columns else dp * _WORKER_BASE + pp
        step = self._numeric(batch, "step", np.int64)
        duration_ms = self._numeric(batch, "duration", np.float64) * 1e3
        start_ms = self._numeric(batch, "start_ts", np.float64) * 1e3 if "start_ts" in self._columns else None
        optype = batch.column("optype")
        if not pa.types.is_dictionary(optype.type):
            optype = optype.dictionary_encode()  # imports pyarrow.compute only for such a file
        names = optype.dictionary.to_pylist()
        codes = optype.indices.to_numpy(zero_copy_only=False)

        valid = np.ones(n, dtype=bool)
        bad = ~np.isfinite(duration_ms) | (duration_ms < 0)
        self._bad_rows(bad, first_row, "duration must be a finite number >= 0 seconds", "bad_value")
        valid &= ~bad
        if start_ms is not None:
            bad = valid & ~(np.isfinite(start_ms) & (start_ms >= 0))
            self._bad_rows(bad, first_row, "start_ts must be a finite number >= 0 seconds", "bad_value")
            valid &= ~bad
        bad = valid & ((dp < 0) | (pp < 0) | (rank < 0) | (step < 0))
        self._bad_rows(bad, first_row, "dp_rank, stage, rank and step must be >= 0", "bad_value")
        valid &= ~bad
        valid &= self._check_layout(dp, pp, rank, valid, first_row, layout, first_rows)

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

        seq = self._numeric(batch, "seq_id", np.int64) if "seq_id" in self._columns else np.full(n, -1, np.int64)
        mc = self._numeric(batch, "mc", np.int64) if "mc" in self._columns else np.full(n, -1, np.int64)
        name_ids = np.array([self._name_ids.setdefault(str(x), len(self._name_ids)) for x in names], dtype=np.int64)
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
            mb = self._numeric(batch, "mb_id", np.int64) if "mb_id" in self._columns else np.full(n, -1, np.int64)
            start_s = start_ms / 1e3 if start_ms is not None else np.full(n, np.nan)
            self._ops.add(rank[valid], step[valid], self._ops.name_ids([str(x) for x in names])[codes[valid]],
                          start_s[valid], duration_ms[valid] / 1e3, seq[valid], mb[valid], mc[valid])

    def _check_layout(self, dp: np.ndarray, pp: np.ndarray, rank: np.ndarray, valid: np.ndarray, first_row: int,
                      layout: dict[int, tuple[int, int]], first_rows: dict[int, int]) -> np.ndarray:
        """Rows inside the declared layout (when one is given) whose rank keeps one (dp_rank, stage)."""
        ok = np.ones(rank.shape, dtype=bool)
        topo = self._topology
        if topo is not None:
            bad = valid & out_of_bounds(topo, dp, pp, rank if "rank" in self._columns else np.zeros_like(rank))
            self._bad_rows(bad, first_row, f"dp_rank, stage or rank outside the declared layout (dp {topo.dp}, "
                           f"pp {topo.pp}, tp {topo.tp}, dsp {topo.slots // topo.tp}: {topo.world_size} ranks)",
                           "layout")
            ok &= ~bad
        keep = valid & ok
        # One 64-bit hash per (rank, dp_rank, stage): a 1-D unique is several times faster than axis=0.
        packed = row_keys(rank[keep], dp[keep], pp[keep])
        _, first, count = np.unique(packed, return_index=True, return_counts=True)
        # A rank new in this batch takes its most frequent (dp_rank, stage); the others are reported.
        order = np.lexsort((first, -count, rank[keep][first]))
        first = first[order]
        rows = np.flatnonzero(keep)[first] + first_row + 1
        triples = zip(rank[keep][first].tolist(), dp[keep][first].tolist(), pp[keep][first].tolist())
        for (r, d, p), row in zip(triples, rows.tolist()):
            first_rows.setdefault(r, row)
            if layout.setdefault(r, (d, p)) != (d, p):
                moved = keep & (rank == r) & ((dp != layout[r][0]) | (pp != layout[r][1]))
                self._bad_rows(moved, first_row, f"rank {r} changes (dp_rank, stage) from {layout[r]} (row "
                               f"{first_rows[r]})", "layout")
                ok &= ~moved
        return ok

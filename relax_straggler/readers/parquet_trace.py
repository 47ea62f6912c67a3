"""Per-operation parquet traces (the what-if analysis layout, OSDI'25 artifact).

One row per operation with columns dp_rank, stage (pipeline rank), rank, step, optype
(a Megatron timer name), duration (seconds), and optionally start_ts (seconds, gives the
step's wall time), seq_id and mc (model chunk; both make the duplicate key). Read in
record batches with pyarrow, so memory does not grow with the file (op_trace.py).

Row problems, each reported with its 1-based row number: NaN or negative durations,
NaN or negative start times, a rank whose dp_rank/stage disagree with the topology,
duplicate rows (same rank, step, optype, seq_id, mc), unknown op names.
"""

from __future__ import annotations

import os
from typing import Iterator, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from relax_straggler.readers.base import InputError, Problems, StepTimes
from relax_straggler.topology import Topology
from relax_straggler.readers.op_trace import (DuplicateFilter, OpNames, StepAccumulator, load_meta, meta_path_for,
                                              row_keys)

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "duration")
OPTIONAL = ("start_ts", "seq_id", "mc")
BATCH_ROWS = 1 << 16


class ParquetTraceReader:
    format = "parquet-trace"

    def __init__(self, path: str, problems: Problems, topology: Optional[Topology] = None,
                 meta: Optional[str] = None) -> None:
        self.path = path
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
        layout: dict[int, tuple[int, int]] = {}
        try:
            batches = self._file.iter_batches(batch_size=BATCH_ROWS, columns=self._columns)
            for batch in batches:
                n = batch.num_rows
                self._add_batch(batch, first_row, acc, dups, layout)
                first_row += n
                self.records = first_row
                self.done_bytes = int(first_row * per_row)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"{self.path}:{first_row + 1}: cannot read rows from here on: {exc}") from None
        if self._topology is None:
            self._topology = self._infer_topology(layout)
        self.done_bytes = self.total_bytes
        yield from acc.steps(self.path)

    def _add_batch(self, batch: pa.RecordBatch, first_row: int, acc: StepAccumulator, dups: DuplicateFilter,
                   layout: dict[int, tuple[int, int]]) -> None:
        n = batch.num_rows
        dp = self._numeric(batch, "dp_rank", np.int64)
        pp = self._numeric(batch, "stage", np.int64)
        rank = self._numeric(batch, "rank", np.int64)
        step = self._numeric(batch, "step", np.int64)
        duration_ms = self._numeric(batch, "duration", np.float64) * 1e3
        start_ms = self._numeric(batch, "start_ts", np.float64) * 1e3 if "start_ts" in self._columns else None
        optype = batch.column("optype")
        if not pa.types.is_dictionary(optype.type):
            optype = pc.dictionary_encode(optype)
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
        valid &= self._check_layout(dp, pp, rank, valid, first_row, layout)

        stage = np.full(n, -1, dtype=np.int64)
        p2p = np.full(n, -1, dtype=np.int64)
        for code, name in enumerate(names):
            rows = codes == code
            count = int(np.count_nonzero(rows & valid))
            if count == 0:
                continue
            target = self.names.resolve(str(name), first_row + int(np.argmax(rows & valid)) + 1, count)
            if target is not None:
                stage[rows] = target.stage
                p2p[rows] = -1 if target.p2p is None else target.p2p
        valid &= stage >= 0

        seq = self._numeric(batch, "seq_id", np.int64) if "seq_id" in self._columns else np.zeros(n, np.int64)
        mc = self._numeric(batch, "mc", np.int64) if "mc" in self._columns else np.zeros(n, np.int64)
        name_ids = np.array([self._name_ids.setdefault(str(x), len(self._name_ids)) for x in names], dtype=np.int64)
        keys = row_keys(rank, step, name_ids[codes], seq, mc)
        dup = np.zeros(n, dtype=bool)
        dup[valid] = dups.seen_before(keys[valid])
        self._bad_rows(dup, first_row, "duplicate row (same rank, step, optype, seq_id, mc as an earlier row)",
                       "duplicate")
        valid &= ~dup
        acc.add(step[valid], rank[valid], stage[valid], p2p[valid], duration_ms[valid],
                None if start_ms is None else start_ms[valid])

    def _check_layout(self, dp: np.ndarray, pp: np.ndarray, rank: np.ndarray, valid: np.ndarray, first_row: int,
                      layout: dict[int, tuple[int, int]]) -> np.ndarray:
        """Each rank keeps one (dp_rank, stage), and matches the topology when one is known."""
        ok = np.ones(rank.shape, dtype=bool)
        if self._topology is not None:
            want_dp, want_pp, _ = self._topology.coords(rank)
            bad = valid & ((want_dp != dp) | (want_pp != pp) | (rank >= self._topology.world_size))
            self._bad_rows(bad, first_row, f"dp_rank/stage disagree with the topology (dp {self._topology.dp}, "
                           f"pp {self._topology.pp}, tp {self._topology.tp}) for this rank", "layout")
            ok &= ~bad
        triples = np.unique(np.stack([rank[valid & ok], dp[valid & ok], pp[valid & ok]], axis=1), axis=0)
        for r, d, p in triples.tolist():
            if layout.setdefault(r, (d, p)) != (d, p):
                rows = valid & ok & (rank == r) & ((dp != layout[r][0]) | (pp != layout[r][1]))
                self._bad_rows(rows, first_row, f"rank {r} changes (dp_rank, stage) from {layout[r]}", "layout")
                ok &= ~rows
        return ok

    def _infer_topology(self, layout: dict[int, tuple[int, int]]) -> Topology:
        """Without metadata: dp and pp from the largest ids; tp from the rank numbering
        when it is consistent with rank = tp_rank + tp x (dp_rank + dp x pp_rank)."""
        if not layout:
            raise InputError(f"{self.path}: no usable operation rows")
        ranks = np.array(list(layout), dtype=np.int64)
        dps = np.array([d for d, _ in layout.values()])
        pps = np.array([p for _, p in layout.values()])
        dp, pp = int(dps.max()) + 1, int(pps.max()) + 1
        for tp in range(1, (int(ranks.max()) + 1) // (dp * pp) + 1):
            topo = Topology(dp=dp, pp=pp, tp=tp)
            got_dp, got_pp, _ = topo.coords(ranks)
            if ranks.max() < topo.world_size and (got_dp == dps).all() and (got_pp == pps).all():
                return topo
        raise InputError(f"{self.path}: the rank numbers follow no dp {dp} x pp {pp} x tp layout "
                         "(rank = tp_rank + tp x (dp_rank + dp x pp_rank)); give --meta or --dp/--pp/--tp")


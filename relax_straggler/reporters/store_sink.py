"""The live sink: the training job's reports, as megatron_metrics rows, into a metrics store.

A sink (relax_straggler.reporters.base.Sink) on the metrics rank. The report thread
only converts a report to rows and appends them to a bounded buffer; a writer thread of its
own sends them in batches, so a slow or dead store never holds up the report thread, let
alone training (docs/ARCHITECTURE.md invariant 5). When the store fails, rows stay buffered and are sent again
once it answers; when the buffer is full the oldest reports' rows are dropped. Every failed
write and dropped row is counted (StoreSink.counters) and logged at most once per
`log_every_s`.

Rows of one report (step s, timestamp = when the report was converted):

    metric_name                      value (ms, one per row)
    forward-compute, backward-compute, optimizer, batch-generator, all-grads-sync,
    grads-all-reduce, grads-reduce-scatter, params-all-gather
                                     the stage of that Megatron timer (common/megatron_timers.py)
    straggler/<stage>                a stage without a Megatron timer (attention, moe,
                                     communication/broadcast|alltoall|send|recv)
    interval-time                    the rank's timed step: the sum of its core stages
                                     (forward, backward, optimizer, communication, data)

one row per rank and stage it ran (device time as measured; compute stages without the
time spent blocked on a collective, as the report judges them). rank is the rank within
the analyzed group (the global rank for the default group). With the live analyzer's
confirmed verdict, its rows follow (straggler/verdict and one straggler/verdict/finding per
finding, relax_straggler.stores.verdict_rows). A hang answer (relax_straggler.hang.publish)
is one straggler/hang row (relax_straggler.stores.hang_rows). A normal end of the run
(close() of the run's own sink, built with marks_end=True, which uninstall() closes) is one
straggler/end row after the last report's (relax_straggler.stores.end_rows): the monitor
then shows the job finished.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa

from relax_straggler.common.megatron_timers import stage_timer_name
from relax_straggler.stores import end_rows, hang_rows, verdict_rows
from relax_straggler.stores.base import SAMPLE_SCHEMA, STEP_METRIC, Sample, Store, samples_to_table
from relax_straggler.stores.url import parse_writer_url
from relax_straggler.common.metric_names import (FINDING_METRIC, VERDICT_CAUSE, VERDICT_CONFIDENCE, VERDICT_METRIC,
                                          VERDICT_RANK, VERDICT_RATIO, VERDICT_SINCE_STEP, VERDICT_STAGE)
from relax_straggler.common.stages import CORE_STAGES
from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink

log = logging.getLogger(__name__)


def default_job_id() -> str:
    """The launcher's run id (torchrun: TORCHELASTIC_RUN_ID; Slurm: SLURM_JOB_ID), else
    host-pid-time, so one training run is one job."""
    for var in ("TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = os.environ.get(var, "")
        if value and value != "none":
            return value
    return f"{socket.gethostname()}-{os.getpid()}-{int(time.time())}"


def default_nodes(world_size: int) -> list[str]:
    """Node name per rank: "node-K" with K = rank // LOCAL_WORLD_SIZE when the launcher sets
    it (torchrun numbers ranks node by node), else "" (unknown)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    return [f"node-{r // local}" if local > 0 else "" for r in range(world_size)]


def report_rows(report: Report, job: str, timestamp: float, nodes: Sequence[str], cluster: str = "") -> pa.Table:
    """The megatron_metrics rows of one report (see the module docstring) as a SAMPLE_SCHEMA
    table: one row per rank and stage with a finite time, then one interval-time row per
    rank that ran a core stage. nodes: node name per rank (len >= report.num_ranks)."""
    ms = report.device_ms
    names = [stage_timer_name(s) for s in report.stages]
    core = [j for j, s in enumerate(report.stages) if s in CORE_STAGES]
    rank_idx, stage_idx = np.nonzero(np.isfinite(ms))
    values = ms[rank_idx, stage_idx]
    metric = np.array(names, dtype=object)[stage_idx]
    if core:
        timed = np.isfinite(ms[:, core]).any(axis=1)
        step_ranks = np.flatnonzero(timed)
        rank_idx = np.concatenate([rank_idx, step_ranks])
        values = np.concatenate([values, np.nansum(ms[step_ranks][:, core], axis=1)])
        metric = np.concatenate([metric, np.full(step_ranks.size, STEP_METRIC, dtype=object)])
    n = int(rank_idx.size)
    timers = pa.table({
        "timestamp": pa.array(np.full(n, timestamp), pa.float64()),
        "job": pa.array([job] * n, pa.string()),
        "metric_name": pa.array(metric, pa.string()),
        "subname": pa.array([""] * n, pa.string()),
        "rank": pa.array(rank_idx.astype(np.int32), pa.int32()),
        "iteration": pa.array(np.full(n, report.step, dtype=np.int64), pa.int64()),
        "node": pa.array(np.asarray(nodes, dtype=object)[rank_idx] if n else [], pa.string()),
        "cluster": pa.array([cluster] * n, pa.string()),
        "metric_values": pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32)),
                                                  pa.array(values, pa.float64())),
    }, schema=SAMPLE_SCHEMA)
    if report.verdict is None:
        return timers
    return pa.concat_tables([timers, verdict_table(report, job, timestamp, nodes[0] if len(nodes) else "", cluster)])


def verdict_table(report: Report, job: str, timestamp: float, node: str, cluster: str = "") -> pa.Table:
    """The confirmed verdict's rows of one report (relax_straggler.stores.verdict_rows), in
    rows of rank 0 on `node`; report.verdict must be set."""
    v = report.verdict
    metrics = v.metrics()
    rows = [(VERDICT_METRIC, *verdict_rows.encode(
        v.status, metrics[VERDICT_STAGE], metrics[VERDICT_CAUSE],
        [metrics[VERDICT_RANK], metrics[VERDICT_SINCE_STEP], metrics[VERDICT_CONFIDENCE], metrics[VERDICT_RATIO]],
        verdict_rows.VERDICT_VALUES))]
    for f in v.findings:
        rows.append((FINDING_METRIC, *verdict_rows.encode(
            f.state, f.stage, f.cause,
            [f.rank, f.group, f.since_step, f.confidence, f.ratio, f.facts.rank_ms, f.facts.ref_ms, f.facts.excess_ms,
             f.facts.wait_caused_ms, f.facts.reports_agreeing, f.facts.reports_seen], verdict_rows.FINDING_VALUES)))
    return samples_to_table([Sample(timestamp, job, name, 0, report.step, tuple(values), subname=subname, node=node,
                                    cluster=cluster) for name, subname, values in rows])


class StoreSink(Sink):
    """Sink writing each report's rows to the store at `url` (``file://DIR`` or
    ``clickhouse://HOST:PORT/DB``, optionally ``?job=ID``).

    job: the job id (default: ?job= of the URL, else default_job_id()). cluster: the
    cluster column. nodes: node name per rank (ranks beyond it, or all when None:
    default_nodes). batch_rows: rows per write (a batch holds whole reports, so it can be
    larger). flush_interval_s: the longest a row waits in the buffer while the store
    answers. max_buffered_rows: the bound of the buffer; beyond it the oldest reports are
    dropped (counted). log_every_s: at most one failure warning per this many s.
    open_store: URL -> Store (relax_straggler.stores.opener.open_store by default).
    marks_end: close() queues the end-of-run row first (the module docstring): the sink is
    the run's own, closed when the run ends normally; False for a sink opened for one
    hang answer.
    Raises ValueError for a bad URL; a store that cannot be opened or written is retried
    by the writer thread (counted, logged), never raised.
    """

    def __init__(self, url: str, job: Optional[str] = None, *, cluster: str = "",
                 nodes: Optional[Sequence[str]] = None, batch_rows: int = 50_000, flush_interval_s: float = 1.0,
                 max_buffered_rows: int = 2_000_000, log_every_s: float = 60.0,
                 open_store: Optional[Callable[[str], Store]] = None, marks_end: bool = False) -> None:
        parsed = parse_writer_url(url)
        if batch_rows < 1 or max_buffered_rows < 1 or flush_interval_s <= 0:
            raise ValueError("batch_rows and max_buffered_rows must be >= 1 and flush_interval_s > 0")
        if open_store is None:
            from relax_straggler.stores.opener import open_store
        self.url = parsed.url
        self.shown = parsed.shown  # url with its password as ***: what logs name
        self.job = job or parsed.job or default_job_id()
        self.cluster = cluster
        self._given_nodes = list(nodes) if nodes is not None else []
        self._nodes: Optional[list[str]] = None
        self._open_store = open_store
        self._marks_end = marks_end
        self._store: Optional[Store] = None
        self._batch_rows, self._flush_s, self._max_rows = batch_rows, flush_interval_s, max_buffered_rows
        self._log_every_s = log_every_s
        self._buffer: deque[pa.Table] = deque()
        self._buffered = 0
        self._cond = threading.Condition()
        self._closing = False
        self._idle = True  # no batch is being written
        self._failing = False  # the last write failed
        self._flushers = 0  # flush() calls waiting
        self.written_rows = 0
        self.dropped_rows = 0
        self.failed_writes = 0
        self._last_log = -float("inf")
        self._unlogged_failures = 0
        self._last_error = ""
        self._last_step: Optional[int] = None  # the newest step of a report taken
        self._steps = 0  # reports of training steps taken (hang answers not counted)
        self._thread = threading.Thread(target=self._run, name="relax_straggler-store-sink", daemon=True)
        self._thread.start()

    # Sink ------------------------------------------------------------------------------
    def write(self, report: Report) -> None:
        """Converts `report` and queues its rows (on the report thread; never blocks on the store)."""
        if self._nodes is None or len(self._nodes) < report.num_ranks:  # ranks beyond `nodes`: default names
            self._nodes = self._given_nodes + default_nodes(report.num_ranks)[len(self._given_nodes):]
        rows = report_rows(report, self.job, time.time(), self._nodes, self.cluster)
        self._last_step = report.step if self._last_step is None else max(self._last_step, report.step)
        self._steps += 1
        if rows.num_rows == 0:
            return
        self._queue(rows)

    def write_hang(self, event: HangEvent) -> None:
        """Queues the answer's one row, in rows of rank 0's node (never blocks on the store)."""
        self._queue(hang_rows.hang_table(event.metrics, self.job, time.time(), self._first_node(), self.cluster))

    def _first_node(self) -> str:
        """Rank 0's node name, "" when unknown."""
        nodes = self._nodes if self._nodes is not None else self._given_nodes
        return nodes[0] if nodes else ""

    def _queue(self, rows: pa.Table) -> None:
        with self._cond:
            if self._closing:
                self.dropped_rows += rows.num_rows
                return
            self._buffer.append(rows)
            self._buffered += rows.num_rows
            self._bound()
            if self._buffered >= self._batch_rows:
                self._cond.notify_all()

    def counters(self) -> dict[str, int]:
        """{store_written_rows, store_dropped_rows, store_failed_writes, store_buffered_rows}."""
        with self._cond:
            return {"store_written_rows": self.written_rows, "store_dropped_rows": self.dropped_rows,
                    "store_failed_writes": self.failed_writes, "store_buffered_rows": self._buffered}

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Waits until every queued row is written; False when `timeout_s` passes first
        (the store is failing or slow)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flushers += 1
            self._cond.notify_all()
            try:
                while self._buffered or not self._idle:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
            finally:
                self._flushers -= 1
        return True

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Writes what is buffered (for at most `timeout_s` to flush, as much again to stop
        the writer), stops the writer, closes the store. With marks_end, the end-of-run row
        is queued after the last report's rows first (relax_straggler.stores.end_rows), so
        the monitor shows the job finished, not hanging. Rows still unwritten are counted
        as dropped and logged."""
        if not self._thread.is_alive():
            return
        if self._marks_end:
            self._queue(end_rows.end_table(self.job, self._last_step or 0, self._steps, "uninstall", time.time(),
                                           self._first_node(), self.cluster))
        self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout_s)
        with self._cond:
            if self._buffered:
                log.warning("relax_straggler: store %s: %d rows of job %s were not written (store failing: %s)",
                            self.shown, self._buffered, self.job, self._last_error or "timeout")
                self.dropped_rows += self._buffered
                self._buffer.clear()
                self._buffered = 0
        if self._store is not None:
            try:
                self._store.close()
            except Exception:  # closing a broken store must not raise into uninstall()
                log.debug("closing %s", self.shown, exc_info=True)

    def __repr__(self) -> str:
        return f"StoreSink({self.shown!r}, job={self.job!r})"

    # writer thread -----------------------------------------------------------------------
    def _bound(self) -> None:
        """Drops the oldest reports beyond max_buffered_rows. Holds the lock."""
        while self._buffered > self._max_rows and len(self._buffer) > 1:
            old = self._buffer.popleft()
            self._buffered -= old.num_rows
            self.dropped_rows += old.num_rows
        if self._buffered > self._max_rows:  # one report larger than the whole bound
            self.dropped_rows += self._buffered
            self._buffer.clear()
            self._buffered = 0

    def _take(self) -> list[pa.Table]:
        """Whole reports, up to batch_rows rows (at least one report). Holds the lock."""
        batch, rows = [], 0
        while self._buffer and (not batch or rows + self._buffer[0].num_rows <= self._batch_rows):
            t = self._buffer.popleft()
            batch.append(t)
            rows += t.num_rows
        self._buffered -= rows
        return batch

    def _run(self) -> None:
        backoff = self._flush_s
        while True:
            with self._cond:
                self._idle = True
                self._cond.notify_all()
                # Wait for a full batch, a flush() or the interval; while the store fails,
                # for the back-off whatever arrives, so a dead store is not hammered.
                due = time.monotonic() + backoff
                while not self._closing:
                    left = due - time.monotonic()
                    if left <= 0 or not self._failing and (self._buffered >= self._batch_rows or self._flushers):
                        break
                    self._cond.wait(left)
                if self._closing:
                    return
                if not self._buffered:
                    continue
                batch = self._take()
                self._idle = False
            rows = sum(t.num_rows for t in batch)
            try:
                if self._store is None:
                    self._store = self._open_store(self.url)
                self._store.write_table(pa.concat_tables(batch))
            except ValueError as exc:  # rows the store refuses: sending them again cannot help
                with self._cond:
                    self.dropped_rows += rows
                log.error("relax_straggler: store %s refused %d rows of job %s: %s", self.shown, rows, self.job, exc)
                continue
            except Exception as exc:  # StoreError, or a store that cannot be opened yet
                with self._cond:
                    self._buffer.extendleft(reversed(batch))
                    self._buffered += rows
                    self._bound()
                    self.failed_writes += 1
                    self._unlogged_failures += 1
                    self._last_error = str(exc)
                    self._failing = True
                self._log_failure()
                backoff = min(backoff * 2, 30.0)
                continue
            with self._cond:
                self.written_rows += rows
                recovered, self._failing = self._failing, False
            if recovered:
                log.warning("relax_straggler: store %s answers again (%d failed writes, %d rows dropped so far)",
                            self.shown, self.failed_writes, self.dropped_rows)
            backoff = self._flush_s

    def _log_failure(self) -> None:
        now = time.monotonic()
        if now - self._last_log < self._log_every_s:
            return
        self._last_log = now
        log.warning("relax_straggler: store %s: %d failed write(s) since the last message (%d in all), %d rows "
                    "buffered, %d dropped; training continues. Last error: %s", self.shown, self._unlogged_failures,
                    self.failed_writes, self._buffered, self.dropped_rows, self._last_error)
        self._unlogged_failures = 0

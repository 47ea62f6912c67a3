"""Loading a recorded run into a metrics store (``relax-straggler ingest``).

A reader (relax_straggler.readers.open_source) streams the input step by step; each step
becomes megatron_metrics rows through relax_straggler.monitor.feed.step_table (the same
rows the feed writes: Megatron timer names, p2p ops, one interval-time row per rank), and
rows go to the store in batches of about `batch_rows`, so memory stays bounded whatever
the input size. Min/max-only Megatron logs carry no per-rank times and are refused.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

import pyarrow as pa

from relax_straggler.monitor.feed import step_table
from relax_straggler.stores.base import Store, StoreError
from relax_straggler.readers.base import InputError, MinMaxStep, Source

T = TypeVar("T")


@dataclass
class IngestStats:
    """What one ingest wrote: steps, rows, write requests, wall time (s)."""

    steps: int = 0
    rows: int = 0
    writes: int = 0
    seconds: float = 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")


def ingest(source: Source, store: Store, job: str, *, ranks_per_node: int = 8, cluster: str = "",
           batch_rows: int = 100_000, retries: int = 3, retry_wait_s: float = 1.0,
           progress: Optional[Callable[[int, int], None]] = None, stats: Optional[IngestStats] = None,
           clock: Callable[[], float] = time.time) -> IngestStats:
    """Writes every step of `source` into `store` as job `job`; rows are stamped when their
    step is read (s since the epoch). A batch the store refuses with StoreError is sent
    again up to `retries` times (waits retry_wait_s, doubling). progress(done_bytes,
    total_bytes) is called after each step. stats: accumulate into this (several inputs).
    Raises InputError from the reader or for a min/max-only log, ValueError for bad
    arguments, StoreError when the store still fails after the retries."""
    if batch_rows < 1 or ranks_per_node < 1 or retries < 0:
        raise ValueError("batch_rows and ranks_per_node must be >= 1, retries >= 0")
    stats = stats if stats is not None else IngestStats()
    start = time.monotonic()
    pending: list[pa.Table] = []
    pending_rows = 0

    def flush() -> None:
        nonlocal pending, pending_rows
        if pending:
            _write(store, pa.concat_tables(pending), retries, retry_wait_s)
            stats.rows += pending_rows
            stats.writes += 1
            pending, pending_rows = [], 0

    for step in source.steps():
        if isinstance(step, MinMaxStep):
            raise InputError(f"{source.path}: a min/max timer log has no per-rank times, so it has no rows to store "
                             "(log with --timing-log-option all)")
        table = step_table(job, step, clock(), ranks_per_node, cluster)
        pending.append(table)
        pending_rows += table.num_rows
        stats.steps += 1
        if pending_rows >= batch_rows:
            flush()
        if progress is not None:
            progress(source.done_bytes, source.total_bytes)
    flush()
    stats.seconds += time.monotonic() - start
    return stats


def _write(store: Store, table: pa.Table, retries: int, wait_s: float) -> None:
    retrying(lambda: store.write_table(table), retries, wait_s)


def retrying(call: Callable[[], T], retries: int = 3, wait_s: float = 1.0) -> T:
    """call(), repeated up to `retries` times on a StoreError that is not permanent,
    waiting wait_s, doubling (1, 2, 4 s by default). Raises the last StoreError."""
    for attempt in range(retries + 1):
        try:
            return call()
        except StoreError as exc:
            if exc.permanent or attempt == retries:
                raise
            time.sleep(wait_s * 2**attempt)
    raise AssertionError("unreachable")

"""The monitor's analysis pool: a completed slow streak of a job is analysed (exactly that
window of iterations, range_analysis.py) on a thread of its own; the poll and the API never
wait for one. A failed analysis is the job's `error`, a finished one its newest result;
either way the job's record is saved."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from typing import Callable

from relax_straggler.analysis import AnalyzeConfig
from relax_straggler.monitor.connection import StoreConnection
from relax_straggler.monitor.jobs import JobRecord
from relax_straggler.monitor.metrics import MonitorMetrics
from relax_straggler.monitor.range_analysis import analyze_range
from relax_straggler.monitor.trigger import IterationRange
from relax_straggler.readers.base import InputError
from relax_straggler.stores.base import StoreError

log = logging.getLogger(__name__)


class AnalysisPool:
    """Analyses on `workers` threads, of the store `connection` holds, with `analyze`'s
    thresholds; keeps the newest `max_results` results per job. lock: guards the job
    records; clock: wall time, s; save(job_id): saves a job's record."""

    def __init__(self, workers: int, analyze: AnalyzeConfig, max_results: int, connection: StoreConnection,
                 lock: threading.RLock, metrics: MonitorMetrics, clock: Callable[[], float],
                 save: Callable[[str], None]) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="straggler-analysis")
        self._analyze_config = analyze
        self._max_results = max_results
        self._connection = connection
        self._lock = lock
        self._metrics = metrics
        self._clock = clock
        self._save = save

    def submit(self, record: JobRecord, window: IterationRange) -> None:
        """Queues the analysis of `window` of `record`'s job (the caller holds the lock)."""
        record.in_flight = True
        self._pool.submit(self._analyze, record, window)

    def shutdown(self, wait: bool = True) -> None:
        """Takes no more analyses; with `wait`, returns when the queued ones finished."""
        self._pool.shutdown(wait=wait, cancel_futures=False)

    def _analyze(self, record: JobRecord, window: IterationRange) -> None:
        started = time.perf_counter()
        try:
            store = self._connection.store
            if store is None:
                raise StoreError(f"{self._connection.shown}: not connected (reconnecting)")
            result = analyze_range(store, record.job_id, window, record.registered_at, record.topology,
                                   self._analyze_config)
        except (StoreError, InputError, ValueError) as exc:
            log.warning("job %s: analysis of iterations %d-%d failed: %s", record.job_id, window.first_iteration,
                        window.last_iteration, exc)
            self._metrics.analyses.labels(outcome="failed").inc()
            with self._lock:
                record.pending, record.error, record.in_flight = None, f"{type(exc).__name__}: {exc}", False
                record.detector.analysis_failed()
                record.note_status(self._clock())
        except Exception:  # a bug in one analysis must not kill the pool or the job's state
            log.exception("job %s: analysis of iterations %d-%d crashed", record.job_id, window.first_iteration,
                          window.last_iteration)
            self._metrics.analyses.labels(outcome="failed").inc()
            with self._lock:
                record.pending, record.in_flight = None, False
                record.error = "internal error (see the monitor's log)"
                record.detector.analysis_failed()
                record.note_status(self._clock())
        else:
            self._metrics.analyses.labels(outcome="straggler" if result["straggler_rank"] is not None
                                          else "none").inc()
            with self._lock:
                if record.results and "picture" in record.results[-1]:
                    # The picture is the newest window's only. A copy without it, not a change of the
                    # dict a save may be writing out now.
                    record.results[-1] = {k: v for k, v in record.results[-1].items() if k != "picture"}
                record.results.append(result)
                del record.results[:-self._max_results]
                record.pending, record.error, record.in_flight = None, None, False
                record.detector.analysis_finished()
                record.note_status(self._clock())
            log.info("job %s: iterations %d-%d: %s", record.job_id, window.first_iteration, window.last_iteration,
                     result["verdict"]["summary"])
        self._metrics.analysis_seconds.observe(time.perf_counter() - started)
        self._metrics.changed()
        self._save(record.job_id)

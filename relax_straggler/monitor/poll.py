"""The monitor's poll loop.

- Every `check_interval_s` the poll thread reads each registered job's new iterations
  (Store.iterations after the last one seen, bounded by the registration time) and folds
  them into the job's JobDetector (trigger.py). A completed slow streak goes to the analysis
  pool (analyses.py), exactly that window.
- Each job is polled on its own: any error reading one job (a StoreError while the store
  still answers a ping, or anything else its data provokes) is that job's (its `poll_error`,
  cleared by its next good read), and the other jobs are polled as usual. Damage the store
  skipped in a job's data (Store.job_problems) is kept in its `store_problems`, and its
  `poll_error` says so while there is any. A StoreError with the store not answering ends
  the poll and drops the connection (connection.py).
- A poll that read no new iteration of a job looks for its end-of-run row (stores.end_rows)
  at or after its last iteration; found, the job is `finished` (trigger.py) and never
  `hanging` until an iteration after it arrives. A job that hangs looks for its own answer
  of which rank and collective hold it (stores.hang_rows).
- A change of a job's status is saved (journal.py), and so is when its newest iteration
  arrived (the hang clock).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

from relax_straggler.common.metric_names import END_METRIC, HANG_METRIC
from relax_straggler.monitor.analyses import AnalysisPool
from relax_straggler.monitor.connection import StoreConnection
from relax_straggler.monitor.jobs import JobRecord
from relax_straggler.monitor.journal import JobJournal
from relax_straggler.monitor.metrics import MonitorMetrics
from relax_straggler.stores import end_rows, hang_rows
from relax_straggler.stores.base import Store, StoreError

log = logging.getLogger(__name__)

MAX_ITERATION = 2**62  # the open end of "every iteration since"


class Poller:
    """Polls the jobs of `jobs` ({job_id: JobRecord}, guarded by `lock`) in the store of
    `connection` every `check_interval_s` s once started; windows to analyse go to
    `analyses`, changes to `journal`. clock: wall time, s. last_poll_s: how long the newest
    poll took, s (None before the first)."""

    def __init__(self, jobs: dict[str, JobRecord], lock: threading.RLock, connection: StoreConnection,
                 analyses: AnalysisPool, journal: JobJournal, metrics: MonitorMetrics, clock: Callable[[], float],
                 check_interval_s: float) -> None:
        self._jobs = jobs
        self._lock = lock
        self._connection = connection
        self._analyses = analyses
        self._journal = journal
        self._metrics = metrics
        self._clock = clock
        self._check_interval_s = check_interval_s
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_poll_s: Optional[float] = None

    def start(self) -> None:
        """Starts the poll thread (its first poll resubmits windows whose analysis a restart cut off)."""
        self._thread = threading.Thread(target=self._loop, name="straggler-monitor-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the poll thread (if started) and waits for its poll to end. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self._check_interval_s + 10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # a bug in one poll must not end polling while the API still answers
                log.exception("poll failed; polling again in %.1f s", self._check_interval_s)
            self._stop.wait(max(0.0, self._check_interval_s - (time.monotonic() - started)))

    def poll_once(self) -> None:
        """One check of every registered job (the poll thread calls it each interval)."""
        started = time.perf_counter()
        store = self._connection.connected()
        if store is not None:
            with self._lock:
                jobs = [(r.job_id, r, r.detector.last_iteration, r.registered_at) for r in self._jobs.values()]
            changed: list[str] = []
            seen: dict[str, tuple[int, float]] = {}
            for job_id, record, last, since in jobs:
                try:
                    new = store.iterations(job_id, after_iteration=-1 if last is None else last, since=since)
                    problems = store.job_problems(job_id)
                except StoreError as exc:
                    if not self._connection.answers(store):
                        self._connection.failed(exc)
                        break
                    self._job_failed(record, str(exc))  # this job's alone: the others are read as usual
                    continue
                except Exception as exc:  # anything its data provokes (e.g. a RecursionError) is this job's too
                    error = f"{type(exc).__name__}: {exc}"
                    if record.poll_error != error:  # its traceback once, not at every poll
                        log.exception("job %s: reading its iterations failed", job_id)
                    self._job_failed(record, error)
                    continue
                try:
                    with self._lock:
                        if self._jobs.get(job_id) is not record:
                            continue  # unregistered meanwhile
                        now = self._clock()
                        if new:
                            record.hang_answer = None  # steps end again: that stop is over
                        window = record.detector.observe(new, now)
                        if window is not None:
                            record.pending = window
                        if record.pending is not None and not record.in_flight:  # new, or cut off by a restart
                            record.detector.predicting = True
                            self._analyses.submit(record, record.pending)
                        record.store_problems = problems
                        record.poll_error = None if not problems else (
                            f"the store skipped damaged data of this job ({len(problems)} problem(s), listed in "
                            f"store_problems), the latest: {problems[-1]}")
                        if new:
                            seen[job_id] = (record.detector.last_iteration, record.detector.last_progress)
                        if record.note_status(now):
                            changed.append(job_id)
                        if not record.detector.finished:
                            record.end = None
                        look_for_answer = record.hang_answer is None and record.detector.hanging(now)
                        look_for_end = not new and not record.detector.finished
                        last_iteration = record.detector.last_iteration
                    if look_for_end and self._read_end(store, record, last_iteration):
                        with self._lock:
                            if record.note_status(self._clock()):
                                changed.append(job_id)
                        look_for_answer = False
                    if look_for_answer:
                        self._read_hang_answer(store, record, last_iteration)
                except Exception:  # a bug on one job's data must not stop the others' polls
                    log.exception("job %s: poll failed", job_id)
                    self._job_failed(record, "internal error (see the monitor's log)")
            else:
                self._connection.ok()
            for job_id in changed:
                self._journal.save(job_id)
            self._journal.save_seen(seen)
        self.last_poll_s = time.perf_counter() - started
        self._metrics.poll_seconds.observe(self.last_poll_s)
        self._metrics.refresh()

    def _read_hang_answer(self, store: Store, record: JobRecord, last_iteration: Optional[int]) -> None:
        """Looks for the job's hang answer about a step since its last iteration; a
        malformed answer row is kept as {"error"}, a store error waits for the next poll."""
        first = -1 if last_iteration is None else last_iteration
        try:
            read = list(store.samples(record.job_id, max(first, 0), MAX_ITERATION, since=record.registered_at))
        except StoreError as exc:
            log.debug("job %s: cannot read its hang answer yet: %s", record.job_id, exc)
            return
        try:
            answer = hang_rows.latest_answer([r for r in read if r.metric_name == HANG_METRIC], since_step=first)
        except ValueError as exc:
            answer = {"error": str(exc)}
        if answer is not None and "error" not in answer:
            # The holding rank's node as its own rows name it (the answer's row is rank 0's).
            nodes = {r.rank: r.node for r in read if r.metric_name != HANG_METRIC and r.node}
            answer = {**answer, "node": nodes.get(answer.get("rank"))}
        if answer is not None:
            with self._lock:
                record.hang_answer = answer

    def _read_end(self, store: Store, record: JobRecord, last_iteration: Optional[int]) -> bool:
        """Looks for the job's end-of-run row at or after its last iteration; True when
        found (the job is then finished). A malformed row is logged once and ignored; a
        store error waits for the next poll."""
        first = 0 if last_iteration is None else last_iteration
        try:
            rows = [r for r in store.samples(record.job_id, first, MAX_ITERATION, since=record.registered_at)
                    if r.metric_name == END_METRIC]
            end = end_rows.latest_end(rows)
        except StoreError as exc:
            log.debug("job %s: cannot read its end-of-run row yet: %s", record.job_id, exc)
            return False
        except ValueError as exc:
            if record.end_error != str(exc):
                log.warning("job %s: %s (ignored: the job is not taken as finished)", record.job_id, exc)
                record.end_error = str(exc)
            return False
        if end is None:
            return False
        with self._lock:
            record.detector.finish(end["last_step"])
            if not record.detector.finished:
                return False
            record.end, record.hang_answer = end, None
        return True

    def _job_failed(self, record: JobRecord, error: str) -> None:
        with self._lock:
            if record.poll_error != error:
                log.warning("job %s: cannot read its iterations: %s (the other jobs are polled as usual)",
                            record.job_id, error)
            record.poll_error = error

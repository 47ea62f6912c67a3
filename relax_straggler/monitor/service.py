"""The monitor: registered jobs, the poll loop, the analysis pool, the store connection and
the state file.

- Every `check_interval_s` the poll thread reads each registered job's new iterations
  (Store.iterations after the last one seen, bounded by the registration time) and folds
  them into the job's JobDetector (trigger.py). A completed slow streak submits an analysis
  of exactly that window to a thread pool; the API never waits for one.
- Each job is polled on its own: any error reading one job (a StoreError while the store
  still answers a ping, or anything else its data provokes) is that job's (its `poll_error`,
  cleared by its next good read), and the other jobs are polled as usual. Damage the store
  skipped in a job's data (Store.job_problems) is kept in its `store_problems`, and its
  `poll_error` says so while there is any. `GET /` counts the jobs with a `poll_error`
  (`job_problems`).
- A StoreError with the store not answering closes the store; it is opened again with
  exponential backoff (0.5 s doubling up to 30 s), and `health()` reports the error until then.
- Registered jobs (registration time, topology, detector state, results, a window whose
  analysis had not finished) are appended to the state journal (state.py) on every change
  of a job, before the change is acknowledged, and read back at start: a restart of the
  monitor (even kill -9) or of the store loses no registered job and no result. Each poll
  that saw new iterations appends when they arrived (one "seen" line per job), so the hang
  clock goes on across a restart.
- A poll that read no new iteration of a job looks for its end-of-run row (stores.end_rows)
  at or after its last iteration; found, the job is `finished` (trigger.py) and never
  `hanging` until an iteration after it arrives.

Thread safety: one lock guards the jobs; store I/O and analyses run outside it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from relax_straggler.analysis import AnalyzeConfig
from relax_straggler.metric_names import END_METRIC, HANG_METRIC
from relax_straggler.monitor.metrics import MonitorMetrics
from relax_straggler.stores import end_rows, hang_rows
from relax_straggler.stores.opener import open_store
from relax_straggler.stores.base import Store, StoreError
from relax_straggler.stores.url import DEFAULT_TABLE, parse_store_url, redact
from relax_straggler.monitor.trigger import IterationRange, JobDetector, TriggerConfig
from relax_straggler.monitor.range_analysis import analyze_range
from relax_straggler.monitor.state import StateJournal, read_state
from relax_straggler.monitor.drain import drain_plan
from relax_straggler.monitor.verdict import current_verdict
from relax_straggler.readers.base import InputError
from relax_straggler.topology import Topology

log = logging.getLogger(__name__)

# Status changes kept per job (oldest dropped).
MAX_TRANSITIONS = 50
MAX_ITERATION = 2**62  # the open end of "every iteration since"
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


@dataclass(frozen=True)
class MonitorConfig:
    """store_url: the metrics store; check_interval_s: poll period, s; trigger: the
    detector's thresholds; state_path: the state file (None: monitor-state.json in a
    file:// store's directory, else relax-straggler-monitor-HOST-PORT-DB.json in the working directory);
    workers: analysis threads; max_results: analyses kept per job (oldest dropped);
    max_jobs: registered jobs at most (a registration beyond raises JobLimitError)."""

    store_url: str
    check_interval_s: float = 30.0
    trigger: TriggerConfig = TriggerConfig()
    state_path: Optional[str] = None
    workers: int = 2
    max_results: int = 20
    analyze: AnalyzeConfig = AnalyzeConfig()
    max_jobs: int = 1000

    def __post_init__(self) -> None:
        parse_store_url(self.store_url)
        if not self.check_interval_s > 0:
            raise ValueError(f"check_interval_s must be > 0 s, got {self.check_interval_s}")
        if self.workers < 1 or self.max_results < 1:
            raise ValueError(f"workers and max_results must be >= 1, got {self.workers}, {self.max_results}")
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")

    def resolved_state_path(self) -> str:
        if self.state_path:
            return self.state_path
        store = parse_store_url(self.store_url)
        if store.scheme == "file":
            return os.path.join(store.location, "monitor-state.json")
        # One file per server, database and table: monitors of two stores never share a state file.
        table = "" if store.table in ("", DEFAULT_TABLE) else f"-{store.table}"
        return f"relax-straggler-monitor-{store.location}-{store.port}-{store.database}{table}.json"


@dataclass
class JobRecord:
    """One registered job. results: finished analyses, oldest first (range_analysis dicts);
    pending: the window being analysed; error: why the last analysis failed, if it did;
    transitions: [[s since the epoch, status], ...], each change of status the monitor saw;
    poll_error: why the last read of its iterations failed, or that it skipped damaged data
    (store_problems), None after a good one (not saved);
    store_problems: damage the store skipped in the job's data (Store.job_problems; not saved);
    hang_answer: while it hangs, the job's own answer of which rank and collective hold it
    (relax_straggler.stores.hang_rows), once it is in the store (not saved: read again);
    end: the job's end-of-run row (stores.end_rows.decode) while it is finished."""

    job_id: str
    registered_at: float
    topology: Optional[Topology]
    detector: JobDetector
    results: list = field(default_factory=list)
    pending: Optional[IterationRange] = None
    error: Optional[str] = None
    transitions: list = field(default_factory=list)
    in_flight: bool = False  # an analysis of `pending` is queued or running (not saved)
    poll_error: Optional[str] = None
    store_problems: list = field(default_factory=list)
    hang_answer: Optional[dict] = None
    end: Optional[dict] = None
    end_error: Optional[str] = None  # why its end-of-run row could not be read, logged once (not saved)

    def note_status(self, now: float) -> bool:
        """Records the status at `now` when it changed; True if it did."""
        status = self.detector.status(now)
        if self.transitions and self.transitions[-1][1] == status:
            return False
        self.transitions.append([now, status])
        del self.transitions[:-MAX_TRANSITIONS]
        return True

    def to_dict(self) -> dict:
        """A snapshot (copies of the lists: it is written out after the lock is released)."""
        return {"registered_at": self.registered_at,
                "topology": None if self.topology is None else asdict(self.topology),
                "detector": self.detector.to_dict(), "results": list(self.results),
                "pending": None if self.pending is None else [self.pending.first_iteration,
                                                              self.pending.last_iteration],
                "error": self.error, "transitions": [list(t) for t in self.transitions], "end": self.end}


class JobLimitError(Exception):
    """A registration beyond MonitorConfig.max_jobs; str() says the limit."""


class Monitor:
    """The service behind the API. clock: wall time, s (tests inject one).
    Raises ValueError when the state file cannot be read or written."""

    def __init__(self, config: MonitorConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.metrics = MonitorMetrics(self)
        self._jobs: dict[str, JobRecord] = {}
        self._lock = threading.RLock()
        self._save_lock = threading.Lock()
        self._store: Optional[Store] = None
        self._store_error: Optional[str] = None
        self._store_errors = 0
        self._last_ok: Optional[float] = None
        self._backoff_s = BACKOFF_FIRST_S
        self._next_connect = 0.0
        self._pool = concurrent.futures.ThreadPoolExecutor(config.workers, thread_name_prefix="straggler-analysis")
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.last_poll_s: Optional[float] = None
        self._store_shown = redact(config.store_url)  # the store as answers, logs and the state file name it
        self._journal = StateJournal(config.resolved_state_path(), self._store_shown, self._snapshot)
        self._load_state()

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Starts the poll thread (its first poll resubmits windows whose analysis a restart cut off)."""
        self._thread = threading.Thread(target=self._loop, name="straggler-monitor-poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops polling (if started), waits for running analyses, saves the state, closes
        the store. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self.config.check_interval_s + 10)
        self._pool.shutdown(wait=True, cancel_futures=False)
        self._save_all()
        self._journal.close()
        if self._store is not None:
            self._store.close()
            self._store = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.poll_once()
            except Exception:  # a bug in one poll must not end polling while the API still answers
                log.exception("poll failed; polling again in %.1f s", self.config.check_interval_s)
            self._stop.wait(max(0.0, self.config.check_interval_s - (time.monotonic() - started)))

    # --- registration ------------------------------------------------------------------

    def register(self, job_id: str, topology: Optional[Topology] = None) -> tuple[dict, bool]:
        """Registers `job_id` (from now on: rows older than now are never analysed).
        Returns (the job's view, True) or, when it is registered already, (its view, False);
        a topology given again replaces the registered one. Raises JobLimitError when
        config.max_jobs jobs are registered and `job_id` is not one of them."""
        with self._lock:
            record = self._jobs.get(job_id)
            created = record is None
            if created:
                if len(self._jobs) >= self.config.max_jobs:
                    raise JobLimitError(f"the monitor watches {len(self._jobs):,} jobs, its limit (max_jobs "
                                        f"{self.config.max_jobs:,}); unregister one first")
                now = self.clock()
                record = self._jobs[job_id] = JobRecord(job_id, now, topology, JobDetector(self.config.trigger, now))
                record.note_status(now)
            elif topology is not None:
                record.topology = topology
            view = self.view(job_id)
        self._save(job_id)
        self.metrics.changed()
        return view, created

    def unregister(self, job_id: str) -> dict:
        """Forgets `job_id` and its results; returns its last view. Raises KeyError."""
        with self._lock:
            view = self.view(job_id)
            del self._jobs[job_id]
        self._save(job_id)
        self.metrics.changed()
        return view

    def job_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._jobs)

    def job_count(self) -> int:
        """Registered jobs."""
        return len(self._jobs)

    def job_numbers(self, offset: int = 0, limit: Optional[int] = None) -> list[dict]:
        """Per registered job, by job id from the `offset`-th, at most `limit` (None: all):
        job_id, status, iteration_count, slow_iterations, stragglers (analyses naming a
        rank), last_ms, baseline_ms (ms; None before the first iteration), last_growth (the
        newest step over the baseline median, - 1), verdict (verdict.current_verdict)."""
        with self._lock:
            now = self.clock()
            ids = sorted(self._jobs)[offset:None if limit is None else offset + limit]
            out = []
            for r in (self._jobs[j] for j in ids):
                status = r.detector.status(now)
                out.append({"job_id": r.job_id, "status": status,
                            "iteration_count": r.detector.iteration_count,
                            "slow_iterations": r.detector.slow_iterations,
                            "stragglers": sum(1 for x in r.results if x["straggler_rank"] is not None),
                            "last_ms": r.detector.last_ms, "baseline_ms": r.detector.median_ms,
                            "last_growth": r.detector.last_growth, "verdict": self._verdict(r, status)})
            return out

    @staticmethod
    def _verdict(record: JobRecord, status: str) -> Optional[dict]:
        """The job's current verdict (verdict.current_verdict). Holds the lock."""
        last = record.results[-1] if record.results else None
        rank = None
        if last is not None and last.get("straggler_rank") is not None:
            rank = last["straggler_rank"]
        elif record.hang_answer and isinstance(record.hang_answer.get("rank"), int):
            rank = record.hang_answer["rank"]
        index = record.topology.node_of(rank) if record.topology is not None and rank is not None else None
        return current_verdict(record.job_id, status, last, record.hang_answer, index)

    # --- polling -----------------------------------------------------------------------

    def poll_once(self) -> None:
        """One check of every registered job (the poll thread calls it each interval)."""
        started = time.perf_counter()
        store = self._connected_store()
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
                    if not self._store_answers(store):
                        self._store_failed(exc)
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
                        now = self.clock()
                        if new:
                            record.hang_answer = None  # steps end again: that stop is over
                        window = record.detector.observe(new, now)
                        if window is not None:
                            record.pending = window
                        if record.pending is not None and not record.in_flight:  # new, or cut off by a restart
                            record.detector.predicting = True
                            self._submit(record, record.pending)
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
                            if record.note_status(self.clock()):
                                changed.append(job_id)
                        look_for_answer = False
                    if look_for_answer:
                        self._read_hang_answer(store, record, last_iteration)
                except Exception:  # a bug on one job's data must not stop the others' polls
                    log.exception("job %s: poll failed", job_id)
                    self._job_failed(record, "internal error (see the monitor's log)")
            else:
                self._store_ok()
            for job_id in changed:
                self._save(job_id)
            self._save_seen(seen)
        self.last_poll_s = time.perf_counter() - started
        self.metrics.poll_seconds.observe(self.last_poll_s)
        self.metrics.refresh()

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

    def job_problems(self, shown: int = 20) -> dict:
        """{"count": jobs with a poll_error (a failed read, or damaged data skipped), "jobs":
        the first `shown` of their ids, sorted}."""
        with self._lock:
            ids = sorted(j for j, r in self._jobs.items() if r.poll_error is not None)
        return {"count": len(ids), "jobs": ids[:shown]}

    def _job_failed(self, record: JobRecord, error: str) -> None:
        with self._lock:
            if record.poll_error != error:
                log.warning("job %s: cannot read its iterations: %s (the other jobs are polled as usual)",
                            record.job_id, error)
            record.poll_error = error

    @staticmethod
    def _store_answers(store: Store) -> bool:
        try:
            store.ping()
        except StoreError:
            return False
        return True

    def _connected_store(self) -> Optional[Store]:
        if self._store is not None:
            return self._store
        now = time.monotonic()
        if now < self._next_connect:
            return None
        try:
            # once connected, a file store that vanished must come back, not be made anew and empty
            store = open_store(self.config.store_url, create=self._last_ok is None)
            store.ping()
        except StoreError as exc:
            self._store_failed(exc)
            return None
        log.info("store %s connected", self._store_shown)
        self._store = store
        self._store_ok()
        return store

    def _store_ok(self) -> None:
        self._store_error = None
        self._backoff_s = BACKOFF_FIRST_S
        self._last_ok = self.clock()

    def _store_failed(self, exc: StoreError) -> None:
        self._store_errors += 1
        self.metrics.store_errors.inc()
        if self._store_error is None:
            log.warning("store error: %s; reconnecting", exc)
        self._store_error = str(exc)
        if self._store is not None:
            try:
                self._store.close()
            except StoreError:
                pass  # the connection is being dropped anyway
            self._store = None
        self._next_connect = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, BACKOFF_MAX_S)

    def health(self) -> dict:
        """{"ok", "url", "error", "errors", "last_ok" (s since the epoch), "last_poll_s"}."""
        error = self._store_error
        if error is None and self._store is None:
            error = "not connected yet: the first poll has not run"
        return {"ok": error is None, "url": self._store_shown, "error": error, "errors": self._store_errors,
                "last_ok": self._last_ok, "last_poll_s": self.last_poll_s}

    # --- analyses ----------------------------------------------------------------------

    def _submit(self, record: JobRecord, window: IterationRange) -> None:
        record.in_flight = True
        self._pool.submit(self._analyze, record, window)

    def _analyze(self, record: JobRecord, window: IterationRange) -> None:
        started = time.perf_counter()
        try:
            store = self._store
            if store is None:
                raise StoreError(f"{self._store_shown}: not connected (reconnecting)")
            result = analyze_range(store, record.job_id, window, record.registered_at, record.topology,
                                    self.config.analyze)
        except (StoreError, InputError, ValueError) as exc:
            log.warning("job %s: analysis of iterations %d-%d failed: %s", record.job_id, window.first_iteration,
                        window.last_iteration, exc)
            self.metrics.analyses.labels(outcome="failed").inc()
            with self._lock:
                record.pending, record.error, record.in_flight = None, f"{type(exc).__name__}: {exc}", False
                record.detector.analysis_failed()
                record.note_status(self.clock())
        except Exception:  # a bug in one analysis must not kill the pool or the job's state
            log.exception("job %s: analysis of iterations %d-%d crashed", record.job_id, window.first_iteration,
                          window.last_iteration)
            self.metrics.analyses.labels(outcome="failed").inc()
            with self._lock:
                record.pending, record.in_flight = None, False
                record.error = "internal error (see the monitor's log)"
                record.detector.analysis_failed()
                record.note_status(self.clock())
        else:
            self.metrics.analyses.labels(outcome="straggler" if result["straggler_rank"] is not None
                                         else "none").inc()
            with self._lock:
                if record.results and "picture" in record.results[-1]:
                    # The picture is the newest window's only. A copy without it, not a change of the
                    # dict a save may be writing out now.
                    record.results[-1] = {k: v for k, v in record.results[-1].items() if k != "picture"}
                record.results.append(result)
                del record.results[:-self.config.max_results]
                record.pending, record.error, record.in_flight = None, None, False
                record.detector.analysis_finished()
                record.note_status(self.clock())
            log.info("job %s: iterations %d-%d: %s", record.job_id, window.first_iteration, window.last_iteration,
                     result["verdict"]["summary"])
        self.metrics.analysis_seconds.observe(time.perf_counter() - started)
        self.metrics.changed()
        self._save(record.job_id)

    # --- views -------------------------------------------------------------------------

    def view(self, job_id: str) -> dict:
        """The job's status in the API's JSON shape (see docs/MONITOR.md). Raises KeyError."""
        with self._lock:
            record = self._jobs[job_id]
            det, now = record.detector, self.clock()
            last = record.results[-1] if record.results else None
            prediction = None if last is None else {"straggler_rank": last["straggler_rank"],
                                                    "straggler_node": last["straggler_node"]}
            status = det.status(now)
            verdict = self._verdict(record, status)
            return _finite({
                "job_id": job_id,
                "status": status,
                "verdict": verdict,
                "drain_plan": drain_plan(verdict, det.last_growth, det.median_ms, det.last_ms, last),
                "registered_at": record.registered_at,
                "topology": None if record.topology is None else asdict(record.topology),
                "end": record.end if det.finished else None,
                "hang_check": {"is_hanging": det.hanging(now), "seconds_since_last_iteration": now - det.last_progress,
                               "hang_threshold_s": det.config.hang_threshold_s,
                               "rca": record.hang_answer if det.hanging(now) else None},
                "slowdown_check": {
                    "is_slow": det.last_slow,
                    "consecutive_slow_iterations": len(det.slow_streak),
                    "slow_iterations": det.slow_iterations,
                    "baseline_ms": det.median_ms,
                    "last_growth": det.last_growth,
                    "slowdown_threshold": det.config.slowdown_threshold,
                    "history_size": det.config.history_size,
                    "straggler_prediction": prediction,
                },
                "metrics": det.metrics(),
                "iteration_count": det.iteration_count,
                "last_iteration": det.last_iteration,
                # .get: results kept in a state file from before a key existed read as null.
                "evidence": None if last is None else {k: last.get(k) for k in (
                    "window", "verdict", "stage", "stages", "kind", "cause", "votes", "algorithms", "mean_ratio",
                    "excess_ms", "confirmed", "live_verdict", "evidence", "analysis_s", "finished_at")},
                "analyses": len(record.results),
                "analysing": None if record.pending is None else [record.pending.first_iteration,
                                                                  record.pending.last_iteration],
                "analysis_error": record.error,
                "poll_error": record.poll_error,
                "store_problems": list(record.store_problems),
                "transitions": [{"at": at, "status": status} for at, status in record.transitions],
            })

    def pictures(self, job_ids: list[str]) -> dict[str, dict]:
        """{job_id: the step x rank picture of its newest analysed window (picture.py)} of
        those of `job_ids` registered and with one."""
        with self._lock:
            out = {}
            for j in job_ids:
                record = self._jobs.get(j)
                if record is not None and record.results and record.results[-1].get("picture"):
                    out[j] = record.results[-1]["picture"]
            return _finite(out)

    def results(self, job_id: str) -> list[dict]:
        """Every kept analysis of the job, oldest first. Raises KeyError."""
        with self._lock:
            return [_finite(r) for r in self._jobs[job_id].results]

    # --- state file --------------------------------------------------------------------

    def _snapshot(self) -> dict:
        with self._lock:
            return {j: r.to_dict() for j, r in self._jobs.items()}

    def _save(self, job_id: str) -> None:
        """Appends `job_id`'s record (or its removal) to the state journal."""
        with self._save_lock:  # the snapshot is taken inside it: a newer record is never followed by an older
            with self._lock:
                record = self._jobs.get(job_id)
                raw = None if record is None else record.to_dict()
            try:
                self._journal.put(job_id, raw)
            except OSError as exc:  # e.g. the store directory is away; the next save rewrites everything
                log.error("cannot write the state file %s: %s (changes since the last save would not survive a "
                          "restart)", self._journal.path, exc)

    def _save_seen(self, seen: dict) -> None:
        """Appends when each job's newest iteration arrived ({job_id: (iteration, s)})."""
        if not seen:
            return
        with self._save_lock:
            try:
                self._journal.put_seen(seen)
            except OSError as exc:
                log.error("cannot write the state file %s: %s (a restart would restart the hang clock of %d job(s))",
                          self._journal.path, exc, len(seen))

    def _save_all(self) -> None:
        with self._save_lock:
            try:
                self._journal.compact()
            except OSError as exc:
                log.error("cannot write the state file %s: %s", self._journal.path, exc)

    def _load_state(self) -> None:
        path = self.config.resolved_state_path()
        try:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # once: never re-made by a save
        except OSError as exc:
            raise ValueError(f"state file {path}: cannot create its directory: {exc.strerror}") from None
        try:
            state = read_state(path)
        except FileNotFoundError:
            state = None
        except (OSError, ValueError) as exc:
            raise ValueError(f"state file {path}: cannot read it: {exc}; move it away to start empty") from None
        if state is not None:
            # Compared without passwords: a rotated password is the same store.
            if redact(state["store"]) != self._store_shown:
                raise ValueError(f"state file {path}: the state of store {redact(state['store'])}, not of "
                                 f"{self._store_shown}; give this store its own --state file")
            for job_id, raw in state["jobs"].items():
                try:
                    topo = raw["topology"]
                    pending = raw["pending"]
                    record = JobRecord(
                        job_id, float(raw["registered_at"]), None if topo is None else Topology(**topo),
                        JobDetector.from_dict(self.config.trigger, raw["detector"]), list(raw["results"]),
                        None if pending is None else IterationRange(int(pending[0]), int(pending[1])),
                        raw["error"], list(raw["transitions"]), end=raw.get("end"))
                    record.detector.predicting = record.pending is not None
                    if "seen" in raw:
                        record.detector.restore_seen(int(raw["seen"][0]), float(raw["seen"][1]))
                except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
                    where = f"{path} line {state['lines'][job_id]}" if job_id in state["lines"] else path
                    raise ValueError(f"state file {where}: malformed record of job {job_id!r}: {exc!r}; move the "
                                     "file away to start empty") from None
                self._jobs[job_id] = record
            log.info("state file %s: %d registered job(s) restored", path, len(self._jobs))
        try:
            self._journal.compact()  # drops a torn last line and superseded records; appends go on from here
        except OSError as exc:
            raise ValueError(f"state file {path}: cannot write it: {exc}") from None


def _finite(value):
    """`value` with every non-finite float as None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

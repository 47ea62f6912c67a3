"""The monitor: the service behind the HTTP API (api.py), made of
- the registered jobs ({job_id: JobRecord}, jobs.py) under one lock, with their views in
  the API's JSON shapes (here);
- the store connection, reconnected with backoff (connection.py);
- the poll loop over every job (poll.py) and the analysis pool of slow windows (analyses.py);
- the job journal in the state file (journal.py, state.py): a change of a job is saved
  before it is acknowledged, and every job is restored at start.

Thread safety: one lock guards the jobs; store I/O and analyses run outside it.
"""

from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from relax_straggler.analysis import AnalyzeConfig
from relax_straggler.common.topology import Topology
from relax_straggler.monitor.analyses import AnalysisPool
from relax_straggler.monitor.connection import StoreConnection
from relax_straggler.monitor.drain import drain_plan
from relax_straggler.monitor.jobs import JobLimitError, JobRecord
from relax_straggler.monitor.journal import JobJournal
from relax_straggler.monitor.metrics import MonitorMetrics
from relax_straggler.monitor.poll import Poller
from relax_straggler.monitor.trigger import JobDetector, TriggerConfig
from relax_straggler.monitor.verdict import current_verdict
from relax_straggler.stores.url import DEFAULT_TABLE, parse_store_url


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


class Monitor:
    """The service behind the API. clock: wall time, s (tests inject one).
    Raises ValueError when the state file cannot be read or written."""

    def __init__(self, config: MonitorConfig, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.clock = clock
        self.metrics = MonitorMetrics(self)
        self._jobs: dict[str, JobRecord] = {}
        self._lock = threading.RLock()
        self._connection = StoreConnection(config.store_url, clock, self.metrics.store_errors.inc)
        self._journal = JobJournal(config.resolved_state_path(), self._connection.shown, self._jobs, self._lock)
        self._pool = AnalysisPool(config.workers, config.analyze, config.max_results, self._connection, self._lock,
                                  self.metrics, clock, self._journal.save)
        self._poller = Poller(self._jobs, self._lock, self._connection, self._pool, self._journal, self.metrics,
                              clock, config.check_interval_s)
        self._journal.restore(config.trigger)

    # --- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Starts the poll thread (its first poll resubmits windows whose analysis a restart cut off)."""
        self._poller.start()

    def stop(self) -> None:
        """Stops polling (if started), waits for running analyses, saves the state, closes
        the store. Idempotent."""
        self._poller.stop()
        self._pool.shutdown(wait=True)
        self._journal.save_all()
        self._journal.close()
        self._connection.close()

    def poll_once(self) -> None:
        """One check of every registered job (the poll thread calls it each interval)."""
        self._poller.poll_once()

    @property
    def last_poll_s(self) -> Optional[float]:
        """How long the newest poll took, s (None before the first)."""
        return self._poller.last_poll_s

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
        self._journal.save(job_id)
        self.metrics.changed()
        return view, created

    def unregister(self, job_id: str) -> dict:
        """Forgets `job_id` and its results; returns its last view. Raises KeyError."""
        with self._lock:
            view = self.view(job_id)
            del self._jobs[job_id]
        self._journal.save(job_id)
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

    def job_problems(self, shown: int = 20) -> dict:
        """{"count": jobs with a poll_error (a failed read, or damaged data skipped), "jobs":
        the first `shown` of their ids, sorted}."""
        with self._lock:
            ids = sorted(j for j, r in self._jobs.items() if r.poll_error is not None)
        return {"count": len(ids), "jobs": ids[:shown]}

    def health(self) -> dict:
        """{"ok", "url", "error", "errors", "last_ok" (s since the epoch), "last_poll_s"}."""
        return {**self._connection.health(), "last_poll_s": self.last_poll_s}

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


def _finite(value):
    """`value` with every non-finite float as None (JSON has no NaN or infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value

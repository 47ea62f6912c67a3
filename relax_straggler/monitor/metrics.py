"""The monitor's Prometheus metrics (GET /metrics), in a registry of its own.

Per job (label job_id: never `job`, which is Prometheus's own target label), computed from
the monitor's state:

    straggler_job_status{job_id,status}               1 for the job's current status, 0 for the others
    straggler_job_iterations{job_id}                  iterations seen since registration
    straggler_job_slow_iterations_total{job_id}       slow iterations seen since registration
    straggler_job_stragglers_total{job_id}            analyses that named a straggler rank
    straggler_job_last_step_seconds{job_id}           the newest iteration's step time, s
    straggler_job_baseline_step_seconds{job_id}       the median of normal iterations, s
    straggler_job_slowdown_ratio{job_id}              the newest step over that median, - 1
                                                      (0.3: 30 % slower; slowdown_check.last_growth)
    straggler_job_verdict_info{job_id,rank,node,stage,cause,status}
                                                      1 while the job has a current verdict
                                                      (verdict.py: a straggler the newest analysis
                                                      named, status confirmed or suspected, or a
                                                      hang's culprit, status hanging); at most
                                                      one per job: named ranks only
    straggler_job_straggler_excess_seconds{job_id}    that straggler's excess over its group per
                                                      step, s (its cost to every step)

Monitor:

    straggler_monitor_jobs                    registered jobs
    straggler_monitor_poll_seconds            histogram of one poll over every job, s
    straggler_monitor_analyses_total{outcome} analyses finished: straggler, none, failed
    straggler_monitor_analysis_seconds        histogram of one analysis (queue wait excluded), s
    straggler_monitor_store_errors_total      store errors (each one drops the connection)
    straggler_monitor_store_up                1 while the store answers
    straggler_monitor_jobs_with_problems      jobs with a poll_error (a failed read, damaged data skipped)

The text is built once per change, not per scrape (at 1,000 jobs, half of them with a
verdict, it is about 630 KB and takes 0.1-0.4 s to build), and kept gzip-compressed as
well (20x smaller, for clients that accept it, as Prometheus does):
- after a poll, by the poll thread, when it was scraped since the previous poll, and at
  most once per BUILD_SHARE of the time (a build of 0.3 s: at most every 3 s), so building
  it never takes more than a tenth of the monitor's time however often it is polled;
- at the first scrape after a change between polls (a registration, a finished analysis),
  which the other scrapes wait for.
Polled values (iterations, statuses) are thus at most one check interval plus ten build
times old.
"""

from __future__ import annotations

import gzip
import math
import threading
import time
from typing import TYPE_CHECKING, Iterator, Optional

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric

from relax_straggler.monitor.trigger import STATUSES

if TYPE_CHECKING:
    from relax_straggler.monitor.service import Monitor

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# The share of the time the poll thread may spend building the text, at most.
BUILD_SHARE = 0.1


class MonitorMetrics:
    """The registry and the monitor's own instruments; per-job families are collected from
    `monitor` when scraped."""

    def __init__(self, monitor: "Monitor") -> None:
        self.registry = CollectorRegistry()
        self.poll_seconds = Histogram("straggler_monitor_poll_seconds", "One poll over every registered job, s",
                                      buckets=_SECONDS, registry=self.registry)
        self.analyses = Counter("straggler_monitor_analyses", "Analyses finished, by outcome", ["outcome"],
                                registry=self.registry)
        self.analysis_seconds = Histogram("straggler_monitor_analysis_seconds", "One analysis of a slow window, s",
                                          buckets=_SECONDS, registry=self.registry)
        self.store_errors = Counter("straggler_monitor_store_errors", "Store errors", registry=self.registry)
        self.registry.register(_JobCollector(monitor))
        self._text: Optional[bytes] = None
        self._gzipped: Optional[bytes] = None
        self._changed = False  # a change between polls: the next scrape builds the text
        self._polled = False  # a poll since the last build: the text may be built again
        self._scraped = False  # text() was called since the previous poll
        self._next_build = 0.0  # time.monotonic() from which the poll thread may build it again
        self._building = threading.Lock()

    def changed(self) -> None:
        """The monitor's state changed (a registration, an analysis): the next scrape builds
        the text again."""
        self._changed = True

    def refresh(self) -> None:
        """After a poll (the poll thread): builds the text now when it was scraped since the
        previous poll and the last build is BUILD_SHARE of the time ago, else leaves it."""
        self._polled = True
        if self._scraped and time.monotonic() >= self._next_build:
            self._scraped = False
            with self._building:
                self._build()

    def text(self, gzipped: bool = False) -> bytes:
        """The Prometheus text format of every metric (gzip-compressed when `gzipped`), as
        of the last build (see the module docstring)."""
        self._scraped = True
        if self._stale():
            with self._building:
                if self._stale():  # not built meanwhile by the scrape this one waited for
                    self._build()
        return self._gzipped if gzipped else self._text

    def _stale(self) -> bool:
        return self._text is None or self._changed or (self._polled and time.monotonic() >= self._next_build)

    def _build(self) -> None:
        started = time.monotonic()
        self._changed = self._polled = False  # first: a change while building marks it stale again
        text = generate_latest(self.registry)
        self._text, self._gzipped = text, gzip.compress(text, compresslevel=1)
        self._next_build = started + (time.monotonic() - started) / BUILD_SHARE


class _JobCollector:
    def __init__(self, monitor: "Monitor") -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        job = ["job_id"]
        status = GaugeMetricFamily("straggler_job_status", "1 for the job's current status", labels=[*job, "status"])
        iterations = GaugeMetricFamily("straggler_job_iterations", "Iterations seen since registration", labels=job)
        slow = CounterMetricFamily("straggler_job_slow_iterations", "Slow iterations since registration", labels=job)
        stragglers = CounterMetricFamily("straggler_job_stragglers", "Analyses that named a straggler rank",
                                         labels=job)
        last_step = GaugeMetricFamily("straggler_job_last_step_seconds", "Newest iteration's step time, s",
                                      labels=job)
        baseline = GaugeMetricFamily("straggler_job_baseline_step_seconds",
                                     "Median step time of normal iterations, s", labels=job)
        slowdown = GaugeMetricFamily("straggler_job_slowdown_ratio",
                                     "Newest step time over the baseline median, minus 1", labels=job)
        verdict = InfoMetricFamily("straggler_job_verdict", "The job's current verdict: straggler or hang culprit",
                                   labels=job)
        excess = GaugeMetricFamily("straggler_job_straggler_excess_seconds",
                                   "The verdict's straggler's excess over its group per step, s", labels=job)
        records = self.monitor.job_numbers()
        for r in records:
            j = [r["job_id"]]
            for s in STATUSES:
                status.add_metric([*j, s], 1.0 if s == r["status"] else 0.0)
            iterations.add_metric(j, r["iteration_count"])
            slow.add_metric(j, r["slow_iterations"])
            stragglers.add_metric(j, r["stragglers"])
            if r["last_ms"] is not None:
                last_step.add_metric(j, r["last_ms"] / 1000.0)
            if r["baseline_ms"] is not None:
                baseline.add_metric(j, r["baseline_ms"] / 1000.0)
            if _finite(r["last_growth"]):
                slowdown.add_metric(j, r["last_growth"])
            v = r["verdict"]
            if v is not None:
                verdict.add_metric(j, {"rank": str(v["rank"]), "node": v["node"], "stage": v["stage"],
                                       "cause": v["cause"], "status": v["status"]})
                if _finite(v["excess_ms"]):
                    excess.add_metric(j, v["excess_ms"] / 1000.0)
        jobs = GaugeMetricFamily("straggler_monitor_jobs", "Registered jobs", value=len(records))
        up = GaugeMetricFamily("straggler_monitor_store_up", "1 while the store answers",
                               value=1.0 if self.monitor.health()["ok"] else 0.0)
        problems = GaugeMetricFamily("straggler_monitor_jobs_with_problems",
                                     "Jobs with a poll error or damaged data the store skipped",
                                     value=self.monitor.job_problems()["count"])
        yield from (status, iterations, slow, stragglers, last_step, baseline, slowdown, verdict, excess, jobs, up,
                    problems)


def _finite(x: Optional[float]) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)

"""The metrics rank's report thread: waits for gathers, judges, and feeds the sinks.

docs/ARCHITECTURE.md invariant 5: nothing here runs on the training thread. The training thread only puts
(step, pending rows) on a bounded queue; a full queue drops the report and counts it
(published as straggler/dropped_reports). A sink that raises is logged once and the
others keep receiving reports; training never sees the exception. A report that cannot
be built is logged with its traceback the first time, then counted and summarised at most
once a minute. close() is bounded: past its limit the thread is abandoned, and no sink is
called after close() returned (docs/DESIGN.md, "Shutdown and faults").
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Callable, Optional, Sequence

# np.median loads numpy.ma on its first call (100-170 ms holding the GIL, which the metrics
# rank's training thread then waits for and times as its own stage): loaded with this module,
# before training, not by the first report that names a straggler.
import numpy.ma  # noqa: F401

from relax_straggler.common.payload import PendingRows
from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import Sink

log = logging.getLogger(__name__)

_STOP = object()
_GRACE_S = 0.4  # of close()'s limit, once it gives up: for the thread to leave a build or be seen in a sink


class ReportPipeline:
    """Bounded queue + one daemon thread.

    build(pending, step) turns gathered rows into a Report, or None when the step has no
    report and the reason was already logged (it runs on the thread); every sink's write()
    receives every Report in order (closing the sinks stays the caller's). close() drains
    what is queued, within its limit, then stops; when it gives up it calls release() (if
    given), which must make a build waiting on a peer return or raise promptly.
    Counters: dropped_reports (queue full), failed_reports (not built), delivered_reports
    (given to every sink), abandoned_reports (left undelivered by close()).
    """

    def __init__(self, build: Callable[[PendingRows, int], Optional[Report]], sinks: Sequence[Sink], queue_size: int,
                 log_every_s: float = 60.0, release: Optional[Callable[[], None]] = None) -> None:
        self._build = build
        self._release = release
        self._sinks = list(sinks)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._failed_sinks: set[int] = set()
        self._log_every_s = log_every_s
        self._unlogged_failures = 0  # build failures since the last message
        self._last_failure_log = 0.0
        self._last_failure = ""
        self._submitted = 0
        self.dropped_reports = 0
        self.failed_reports = 0
        self.delivered_reports = 0
        self.abandoned_reports = 0
        # Set by close() when it gives up. Each sink call checks it holding _in_sink, which
        # close() then takes: no sink call starts after close() returned.
        self._abandoned = False
        self._in_sink = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="relax_straggler-report", daemon=True)
        self._thread.start()

    def submit(self, pending: PendingRows, step: int) -> None:
        """Called on the training thread; never blocks."""
        self._submitted += 1
        try:
            self._queue.put_nowait((pending, step))
        except queue.Full:
            self.dropped_reports += 1
            if self.dropped_reports == 1:
                log.warning("relax_straggler: report queue full; dropping reports (counted in straggler/dropped_reports)")

    @property
    def backlog(self) -> int:
        """Reports queued and not yet taken by the thread (approximate, never blocks)."""
        return self._queue.qsize()

    def close(self, timeout_s: float = 5.0) -> bool:
        """Delivers what is queued for at most timeout_s s, then stops the thread. Returns
        True when every submitted report was delivered, dropped or failed; False when the
        limit passed first (a sink or a peer blocks): the reports left are counted in
        abandoned_reports, one warning says so, and no sink is called after this returns
        (a call already running is left to finish on its daemon thread)."""
        grace = min(_GRACE_S, timeout_s / 2)
        deadline = time.monotonic() + timeout_s - grace
        finished = not self._thread.is_alive()
        if not finished:
            try:
                self._queue.put(_STOP, timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Full:  # the thread is stuck on a report: the queue never empties
                pass
            else:
                self._thread.join(max(deadline - time.monotonic(), 0.0))
            finished = not self._thread.is_alive()
        if not finished:
            self._abandoned = True
            self.abandoned_reports = self._submitted - self.dropped_reports - self.failed_reports - self.delivered_reports
            if self._release is not None:
                self._release()
            # A thread left inside a C++ call with the GIL released (a Gloo wait) when the
            # interpreter exits aborts the process: give a released build time to return.
            self._thread.join(grace / 2)
            # A sink call running now holds the lock (it started before the flag was set);
            # otherwise the thread sees the flag before its next call.
            if self._in_sink.acquire(timeout=grace / 2):
                self._in_sink.release()
            log.warning("relax_straggler: reporting did not finish within %.1f s (a report sink or a rank blocks); "
                        "%d reports were not delivered; shutdown goes on", timeout_s, self.abandoned_reports)
        self._log_failures(final=True)
        return finished

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP or self._abandoned:
                return
            pending, step = item
            try:
                report = self._build(pending, step)
            except Exception as exc:  # a bad step must not end reporting
                if self._abandoned:
                    return
                self._build_failed(step, exc)
                continue
            if self._abandoned:  # released by close(): counted as abandoned there
                return
            if report is None:
                self.failed_reports += 1
                continue
            for i, sink in enumerate(self._sinks):
                with self._in_sink:
                    if self._abandoned:
                        return
                    try:
                        sink.write(report)
                    except Exception:
                        if i not in self._failed_sinks:
                            self._failed_sinks.add(i)
                            log.warning("relax_straggler: report sink %r raised; training continues (shown once)",
                                        sink, exc_info=True)
            self.delivered_reports += 1

    def _build_failed(self, step: int, exc: Exception) -> None:
        self.failed_reports += 1
        self._last_failure = f"step {step}: {type(exc).__name__}: {exc}"
        if self.failed_reports == 1:
            self._last_failure_log = time.monotonic()
            log.warning("relax_straggler: could not build the report of step %d; further failures are counted and "
                        "summarised", step, exc_info=True)
            return
        self._unlogged_failures += 1
        self._log_failures(final=False)

    def _log_failures(self, final: bool) -> None:
        """One line for the failures not logged yet: every log_every_s, and at close."""
        now = time.monotonic()
        if not self._unlogged_failures or (not final and now - self._last_failure_log < self._log_every_s):
            return
        log.warning("relax_straggler: %d more reports could not be built (%d in all; last %s)",
                    self._unlogged_failures, self.failed_reports, self._last_failure)
        self._unlogged_failures = 0
        self._last_failure_log = now

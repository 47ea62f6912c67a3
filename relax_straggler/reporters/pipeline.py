"""The metrics rank's report thread: waits for gathers, judges, and feeds the sinks.

docs/ARCHITECTURE.md invariant 5: nothing here runs on the training thread. The training thread only puts
(step, pending rows) on a bounded queue; a full queue drops the report and counts it
(published as straggler/dropped_reports). A sink that raises is logged once and the
others keep receiving reports; training never sees the exception.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Callable, Optional, Protocol

from relax_straggler.payload import PendingRows
from relax_straggler.report import Report

log = logging.getLogger(__name__)


class Sink(Protocol):
    def __call__(self, report: Report) -> None: ...


_STOP = object()


class ReportPipeline:
    """Bounded queue + one daemon thread.

    build(pending, step) turns gathered rows into a Report (it runs on the thread);
    sinks receive every Report in order. close() drains what is queued, then stops.
    """

    def __init__(self, build: Callable[[PendingRows, int], Report], sinks: list[Sink], queue_size: int) -> None:
        self._build = build
        self._sinks = list(sinks)
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._failed_sinks: set[int] = set()
        self.dropped_reports = 0
        self.failed_reports = 0
        self._thread = threading.Thread(target=self._run, name="relax_straggler-report", daemon=True)
        self._thread.start()

    def submit(self, pending: PendingRows, step: int) -> None:
        """Called on the training thread; never blocks."""
        try:
            self._queue.put_nowait((pending, step))
        except queue.Full:
            self.dropped_reports += 1
            if self.dropped_reports == 1:
                log.warning("relax_straggler: report queue full; dropping reports (counted in straggler/dropped_reports)")

    def close(self, timeout_s: Optional[float] = 60.0) -> None:
        if not self._thread.is_alive():
            return
        self._queue.put(_STOP)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("relax_straggler: report thread did not finish within %.0f s", timeout_s)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            pending, step = item
            try:
                report = self._build(pending, step)
            except Exception:  # a bad step must not end reporting
                self.failed_reports += 1
                log.exception("relax_straggler: could not build the report of step %d", step)
                continue
            for i, sink in enumerate(self._sinks):
                try:
                    sink(report)
                except Exception:
                    if i not in self._failed_sinks:
                        self._failed_sinks.add(i)
                        log.warning("relax_straggler: report sink %r raised; training continues (shown once)",
                                    sink, exc_info=True)

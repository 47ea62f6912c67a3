"""One JSON object per report, appended to a file (the input of offline analysis).

Line schema: {"step", "time" (unix s), "stages" [names], "device_ms" [[ms per stage]
per rank], "tokens" [per rank] or null, "run_queue_ms" [per rank: the training thread's wait
for a CPU in the step, null = not measured] or null, "stragglers" {stage: [ranks]},
"likely_bottleneck", "metrics" {...}, "verdict" {"status", "findings" [{rank, group, stage,
state, since_step, confidence, ratio, persistent, by_window, facts {...}, cause}],
"unjudged_ranks"} or null}. A hang answer is a line of the same schema with no stages
("stages" [], "device_ms" [], "verdict" null) and its straggler/hang/* metrics. NaN is
written as null (strict JSON). Each line is written whole
or not at all (relax_straggler.common.appending): a reader never meets half a report.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time

from relax_straggler.common.appending import append_whole
from relax_straggler.common.serialization import json_safe
from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink

log = logging.getLogger(__name__)


class JsonlSink(Sink):
    """Appends reports to `path` (directories are created), one line per report, each line
    whole or not at all. A line that cannot be written (a full disk, a quota, a file size
    limit) is left out, the file cut back to the end of the previous line: the first such
    failure is one warning, the count of reports left out is given at close(), and neither
    raises (training and uninstall() go on). Later reports are tried again. Raises OSError
    at construction when the file cannot be opened."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self.written = 0  # reports written
        self.failed = 0  # reports left out

    def write(self, report: Report) -> None:
        self._append({
            "step": report.step,
            "time": time.time(),
            "stages": list(report.stages),
            "device_ms": report.device_ms.tolist(),
            "tokens": None if report.tokens is None else report.tokens.tolist(),
            "run_queue_ms": None if report.run_queue_ms is None else report.run_queue_ms.tolist(),
            "stragglers": {k: list(v) for k, v in report.stragglers.items() if v},
            "likely_bottleneck": report.likely_bottleneck,
            "metrics": report.metrics,
            "verdict": None if report.verdict is None else {
                "status": report.verdict.status,
                "findings": [dataclasses.asdict(f) for f in report.verdict.findings],
                "unjudged_ranks": list(report.verdict.unjudged_ranks)},
        }, report.step)

    def write_hang(self, event: HangEvent) -> None:
        self._append({"step": event.step, "time": time.time(), "stages": [], "device_ms": [], "tokens": None,
                      "run_queue_ms": None, "stragglers": {}, "likely_bottleneck": None,
                      "metrics": dict(event.metrics), "verdict": None}, event.step)

    def _append(self, record: dict, step: int) -> None:
        """Appends `record` as one line, whole or not at all (the class docstring)."""
        line = (json.dumps(json_safe(record), allow_nan=False) + "\n").encode()
        with self._lock:
            if self._fd is None:
                return
            try:
                append_whole(self._fd, line)
            except OSError as exc:
                self.failed += 1
                if self.failed == 1:
                    log.warning("relax_straggler: cannot write %s: %s; the report of step %d is left out of it (the "
                                "lines before are whole), later reports are tried again and the count is given at "
                                "uninstall", self.path, exc, step)
                return
            self.written += 1

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Closes the file (at once: nothing is buffered, timeout_s is not needed); one
        warning counts the reports left out, if any. Never raises."""
        with self._lock:
            if self._fd is None:
                return
            try:
                os.close(self._fd)
            except OSError as exc:  # e.g. EIO from a network file system
                log.warning("relax_straggler: closing %s: %s", self.path, exc)
            self._fd = None
        if self.failed:
            log.warning("relax_straggler: %d of %d reports were not written to %s (the disk was full or the file "
                        "could not grow)", self.failed, self.failed + self.written, self.path)

    def __repr__(self) -> str:
        return f"JsonlSink({self.path!r})"

"""One JSON object per report, appended to a file (the input of offline analysis).

Line schema: {"step", "time" (unix s), "stages" [names], "device_ms" [[ms per stage]
per rank], "tokens" [per rank] or null, "stragglers" {stage: [ranks]},
"likely_bottleneck", "metrics" {...}, "verdict" {"status", "findings" [{rank, group, stage,
state, since_step, confidence, ratio, persistent, by_window, facts {...}, cause}],
"unjudged_ranks"} or null}. NaN is written as null (strict JSON).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import time

from relax_straggler.report import Report
from relax_straggler.serialization import json_safe


class JsonlSink:
    """Appends reports to `path` (directories are created); flushed per line."""

    def __init__(self, path: str) -> None:
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def __call__(self, report: Report) -> None:
        record = {
            "step": report.step,
            "time": time.time(),
            "stages": list(report.stages),
            "device_ms": report.device_ms.tolist(),
            "tokens": None if report.tokens is None else report.tokens.tolist(),
            "stragglers": {k: list(v) for k, v in report.stragglers.items() if v},
            "likely_bottleneck": report.likely_bottleneck,
            "metrics": report.metrics,
            "verdict": None if report.verdict is None else {
                "status": report.verdict.status,
                "findings": [dataclasses.asdict(f) for f in report.verdict.findings],
                "unjudged_ranks": list(report.verdict.unjudged_ranks)},
        }
        line = json.dumps(json_safe(record), allow_nan=False)
        with self._lock:
            self._file.write(line + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()

    def __repr__(self) -> str:
        return f"JsonlSink({self.path!r})"

"""Delivers a hang answer to the report sinks as one Report whose metrics are
straggler/hang/* (no stage rows), once per hang.

On the metrics rank the analyzer's own sinks get it (console, JSONL, the metrics store,
the user's callback; the run summary does not: it is no sampled step). A rank that answers
for a stopped metrics rank has no sinks of its own: it opens the configured console, JSONL
and store sinks for the answer and closes them after (the store's write bounded by
STORE_CLOSE_S).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import numpy as np

from relax_straggler.config import StragglerConfig
from relax_straggler.hang.diagnose import HangAnswer
from relax_straggler.report import Report
from relax_straggler.reporters import ConsoleSink, JsonlSink
from relax_straggler.reporters.store_sink import StoreSink

log = logging.getLogger(__name__)

STORE_CLOSE_S = 10.0  # the longest a stand-in waits for the store to take the answer


def hang_report(answer: HangAnswer) -> Report:
    """The Report carrying `answer`: step = the newest step ended, hints = the answer text."""
    empty = np.zeros((0, 0))
    return Report(step=answer.step, stages=(), device_ms=empty, judged_ms=empty, tokens=None, stragglers={},
                  likely_bottleneck=None, top_ranks={}, hints=answer.text(), metrics=answer.metrics())


class HangPublisher:
    """sinks: the metrics rank's sinks, or None on another rank (the configured console,
    JSONL and store sinks are then opened per answer). A sink that raises is logged; the others
    still get the answer. Called on the watchdog thread."""

    def __init__(self, sinks: Optional[list[Any]], config: StragglerConfig) -> None:
        self._sinks = sinks
        self._config = config

    def __call__(self, answer: HangAnswer) -> None:
        report = hang_report(answer)
        opened: list[Any] = []
        if self._sinks is None:
            if self._config.console:
                opened.append(ConsoleSink())
            if self._config.jsonl_path:
                opened.append(JsonlSink(self._config.jsonl_path))
            if self._config.store_url:
                opened.append(StoreSink(self._config.store_url))
        for sink in (self._sinks if self._sinks is not None else opened):
            try:
                sink(report)
            except Exception:
                log.warning("relax_straggler: report sink %r could not take the hang answer", sink, exc_info=True)
        for sink in opened:
            try:
                if isinstance(sink, StoreSink):
                    sink.close(STORE_CLOSE_S)
                elif hasattr(sink, "close"):
                    sink.close()
            except Exception:
                log.warning("relax_straggler: report sink %r did not close after the hang answer", sink, exc_info=True)

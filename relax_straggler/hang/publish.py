"""Delivers a hang answer to the report sinks as one HangEvent (relax_straggler.reporters.base),
once per hang: each sink writes it its own way (write_hang).

On the metrics rank the analyzer's own sinks get it (console, JSONL, the metrics store,
the user's callback, the narrator; the run summary leaves it out: it is no sampled step).
A rank that answers for a stopped metrics rank has no sinks of its own: it builds the
configured outputs (relax_straggler.reporters.factory, for_run=False) for the answer and
closes them after, each bounded by STAND_IN_CLOSE_S.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from relax_straggler.common.metric_names import HANG_ANSWER
from relax_straggler.config import StragglerConfig
from relax_straggler.hang.diagnose import HangAnswer
from relax_straggler.reporters.base import HangEvent, Sink
from relax_straggler.reporters.factory import build_sinks

log = logging.getLogger(__name__)

STAND_IN_CLOSE_S = 10.0  # the longest a stand-in waits for a sink (the store) to take the answer


def hang_event(answer: HangAnswer) -> HangEvent:
    """The event carrying `answer`: its step (the newest step ended), its text and its
    straggler/hang/* metrics."""
    metrics = answer.metrics()
    return HangEvent(step=answer.step, answer=metrics[HANG_ANSWER], metrics=metrics)


class HangPublisher:
    """sinks: the metrics rank's sinks, or None on another rank (the configured outputs are
    then built per answer). A sink that raises is logged; the others still get the answer.
    Called on the watchdog thread."""

    def __init__(self, sinks: Optional[Sequence[Sink]], config: StragglerConfig) -> None:
        self._sinks = sinks
        self._config = config

    def __call__(self, answer: HangAnswer) -> None:
        event = hang_event(answer)
        opened = () if self._sinks is not None else build_sinks(self._config, for_run=False).sinks
        for sink in self._sinks if self._sinks is not None else opened:
            try:
                sink.write_hang(event)
            except Exception:
                log.warning("relax_straggler: report sink %r could not take the hang answer", sink, exc_info=True)
        for sink in opened:
            try:
                sink.close(STAND_IN_CLOSE_S)
            except Exception:
                log.warning("relax_straggler: report sink %r did not close after the hang answer", sink, exc_info=True)

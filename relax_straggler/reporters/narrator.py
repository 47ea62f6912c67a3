"""What the metrics rank says by default, through the `relax_straggler` logger: one line when
the analysis starts (interval, ranks, where reports go), the confirmed verdict's changes,
and the run's summary at uninstall(). --straggler-quiet (StragglerConfig.quiet) silences it.

The lines are INFO records of the `relax_straggler` logger, so a host routes them with its
own logging configuration. A host that configured none (Python would drop INFO records)
still sees them: the logger then gets one stderr handler and level INFO (show_by_default).
"""

from __future__ import annotations

import logging
import sys
from typing import Optional, Sequence

from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink
from relax_straggler.reporters.console import ConsoleSink
from relax_straggler.reporters.summary import RunSummary

LOGGER = "relax_straggler"
_SUMMARY_ALSO = 3  # confirmed (rank, stage) pairs listed after the headline


class _DefaultHandler(logging.StreamHandler):
    """The stderr handler given to a logger nobody configured (the type marks it as ours)."""


def show_by_default() -> None:
    """Makes INFO records of the `relax_straggler` logger visible when the process configured
    no logging at all (no handler on it or on the root logger): adds one stderr handler
    ("%(message)s") and, when its level is unset, sets INFO. Otherwise changes nothing."""
    logger = logging.getLogger(LOGGER)
    if logger.hasHandlers():
        return
    handler = _DefaultHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def summary_lines(summary: RunSummary) -> list[str]:
    """The run's summary as the demo prints it: the headline (RunSummary.headline), then up
    to three more confirmed (rank, stage) pairs than the one it is about."""
    lines = [f"summary: {summary.headline()}"]
    lead = summary.lead()
    lines += [f"         also {c}" for c in [c for c in summary.confirmed() if c != lead][:_SUMMARY_ALSO]]
    return lines


class Narrator(Sink):
    """A report sink that logs the confirmed verdict's changes (the ConsoleSink's lines
    without verbose) and a hang's answer, unless transitions=False (the console prints
    them already); started() and finished() log the first and last lines."""

    def __init__(self, transitions: bool = True, logger: Optional[logging.Logger] = None) -> None:
        self._log = logger or logging.getLogger(LOGGER)
        self._changes = ConsoleSink(verbose=False) if transitions else None

    def started(self, ranks: int, metrics_rank: int, interval: int, warmup_steps: int,
                outputs: Sequence[str], channel: str = "") -> None:
        """The start-up line. outputs: where reports go besides the summary, in words;
        channel: the side channel gathering the rows, in words ("" for a single process)."""
        where = ", ".join([*outputs, "the summary at uninstall()"])
        over = f", over {channel}" if channel else ""
        self._log.info("relax_straggler: analysing %d rank%s (metrics rank %d%s): a report every %d steps from step "
                       "%d; reports go to %s", ranks, "" if ranks == 1 else "s", metrics_rank, over, interval,
                       warmup_steps, where)

    def write(self, report: Report) -> None:
        if self._changes is None:
            return
        for line in self._changes.verdict_changes(report):
            self._log.info("relax_straggler: %s", line.removeprefix("[straggler] "))

    def write_hang(self, event: HangEvent) -> None:
        if self._changes is not None:
            self._log.warning("relax_straggler: HANG after step %d: %s", event.step, event.answer)

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Nothing to release: the last line is finished()'s."""

    def finished(self, summary: RunSummary) -> None:
        for line in summary_lines(summary):
            self._log.info("relax_straggler: %s", line)

    def __repr__(self) -> str:
        return f"Narrator(transitions={self._changes is not None})"

"""What an operator reads on the metrics rank's console: the confirmed verdict's changes
(a straggler confirmed, recovered, a pipeline stage imbalanced), the answer when the job
stops (straggler/hang/*) and, with verbose, the per-step table of every report."""

from __future__ import annotations

import sys
from typing import Optional, TextIO

from relax_straggler.common.metric_names import stage_prefix
from relax_straggler.judge.report import Report
from relax_straggler.reporters.base import CLOSE_TIMEOUT_S, HangEvent, Sink

# States worth a line without verbose: what a person acts on.
_ANNOUNCED = ("straggler", "recovered", "imbalance")


class ConsoleSink(Sink):
    """stream: where to write (stdout by default). verbose: also the per-step table and the
    suspected / insufficient-evidence transitions."""

    def __init__(self, stream: Optional[TextIO] = None, verbose: bool = False) -> None:
        self._stream = stream
        self.verbose = verbose
        self._announced: set[tuple[int, str, str]] = set()  # (rank or -group - 1, stage, state) on screen

    def write(self, report: Report) -> None:
        lines = self._verdict_lines(report)
        if self.verbose:
            lines += self._table(report)
        if lines:
            self._print(lines)

    def write_hang(self, event: HangEvent) -> None:
        self._print([f"[straggler] HANG after step {event.step}: {event.answer}"])

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Nothing to release: the stream stays the caller's."""

    def _print(self, lines: list[str]) -> None:
        out = self._stream or sys.stdout
        out.write("\n".join(lines) + "\n")
        out.flush()

    def verdict_changes(self, report: Report) -> list[str]:
        """The lines of the verdict's changes since the previous report (and remembers them)."""
        return self._verdict_lines(report)

    def _verdict_lines(self, report: Report) -> list[str]:
        verdict = report.verdict
        if verdict is None:
            return []
        lines = []
        shown = _ANNOUNCED + (("suspected", "insufficient_evidence") if self.verbose else ())
        current = set()
        for f in verdict.findings:
            if f.state not in shown:
                continue
            key = (f.rank if f.rank >= 0 else -f.group - 1, f.stage, f.state)
            current.add(key)
            if key not in self._announced:
                lines.append(f"[straggler] step {report.step}: {f.describe()}")
        if self._announced and not current and verdict.status == "healthy":
            lines.append(f"[straggler] step {report.step}: healthy: no rank is slow beyond its group's noise")
        self._announced = current
        return lines

    @staticmethod
    def _table(report: Report) -> list[str]:
        m = report.metrics
        lines = [f"[straggler] step {report.step}: {report.hints}",
                 f"  {'stage':<26}{'mean ms':>10}{'max ms':>10}{'max/ref':>10}{'top rank':>10}  stragglers"]
        for stage in report.stages:
            p = stage_prefix(stage)
            flagged = ",".join(str(r) for r in report.stragglers.get(stage, ())) or "-"
            lines.append(f"  {stage:<26}{m[p + 'mean_ms']:>10.2f}{m[p + 'max_ms']:>10.2f}"
                         f"{m[p + 'slowdown_ratio']:>9.2f}x{m[p + 'top_rank']:>10d}  {flagged}")
        return lines

    def __repr__(self) -> str:
        return f"ConsoleSink(verbose={self.verbose})"

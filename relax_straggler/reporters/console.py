"""A compact table per report, written to a stream (stdout by default)."""

from __future__ import annotations

import sys
from typing import TextIO

from relax_straggler.report import Report


class ConsoleSink:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream

    def __call__(self, report: Report) -> None:
        out = self._stream or sys.stdout
        m = report.metrics
        lines = [f"[straggler] step {report.step}: {report.hints}",
                 f"  {'stage':<26}{'mean ms':>10}{'max ms':>10}{'slowdown':>10}{'top rank':>10}  stragglers"]
        for stage in report.stages:
            p = f"straggler/{stage}/"
            flagged = ",".join(str(r) for r in report.stragglers.get(stage, ())) or "-"
            lines.append(f"  {stage:<26}{m[p + 'mean_ms']:>10.2f}{m[p + 'max_ms']:>10.2f}"
                         f"{m[p + 'slowdown_ratio']:>9.2f}x{m[p + 'top_rank']:>10d}  {flagged}")
        out.write("\n".join(lines) + "\n")
        out.flush()

    def __repr__(self) -> str:
        return "ConsoleSink()"

"""Offline analysis of recorded runs (``relax-straggler analyze``).

    source = relax_straggler.readers.open_source(path)
    result = analyze(source, AnalyzeConfig())
    summary = build_summary(result)       # JSON-ready dict
    render(summary, rich.console.Console())
    relax_straggler.analysis.heatmap.write_heatmap(summary, "heatmap.png")  # imports matplotlib
"""

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.analysis.engine import RunResult, analyze
from relax_straggler.analysis.summary import build_summary
from relax_straggler.analysis.terminal import render

__all__ = ["AnalyzeConfig", "RunResult", "analyze", "build_summary", "render"]

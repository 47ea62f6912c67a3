"""Offline analysis of recorded runs (``relax-straggler analyze``).

    source = relax_straggler.readers.open_source(path)
    result = analyze(source, AnalyzeConfig())
    analysis = build_analysis(result)     # typed: verdict, anomalies, per-rank scores (result.py)
    summary = summary_dict(analysis)      # JSON-ready dict (build_summary(result) does both)
    render(summary, rich.console.Console())
    relax_straggler.analysis.heatmap.write_heatmap(summary, "heatmap.png")  # imports matplotlib
"""

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.analysis.engine import RunResult, analyze
from relax_straggler.analysis.findings import build_analysis
from relax_straggler.analysis.result import Analysis
from relax_straggler.analysis.summary import build_summary, summary_dict
from relax_straggler.analysis.terminal import render

__all__ = ["Analysis", "AnalyzeConfig", "RunResult", "analyze", "build_analysis", "build_summary", "render",
           "summary_dict"]

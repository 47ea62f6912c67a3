"""Offline analysis of recorded runs (``relax-straggler analyze``).

    source = relax_straggler.readers.open_source(path)
    result = analyze(source, AnalyzeConfig(), timeline=True)  # timeline: for the heatmap only
    analysis = build_analysis(result)     # typed: verdict, anomalies, per-rank scores (result.py)
    summary = summary_dict(analysis)      # JSON-ready dict (build_summary(result) does both)
    render(summary, rich.console.Console())
    relax_straggler.analysis.heatmap.write_heatmap(result.timeline.grid(), path, "heatmap.png")  # matplotlib

The names load on first use, so the command line builds its parser (from AnalyzeConfig)
without importing the engine and the readers.
"""

import importlib as _importlib
from typing import Any as _Any

# Public name -> the module that defines it.
_EXPORTS = {
    "Analysis": "relax_straggler.analysis.result",
    "AnalyzeConfig": "relax_straggler.analysis.config",
    "RunResult": "relax_straggler.analysis.engine",
    "analyze": "relax_straggler.analysis.engine",
    "build_analysis": "relax_straggler.analysis.findings",
    "build_summary": "relax_straggler.analysis.summary",
    "summary_dict": "relax_straggler.analysis.summary",
    "render": "relax_straggler.analysis.terminal",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> _Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'relax_straggler.analysis' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

"""Report sinks and the off-thread pipeline that feeds them (docs/ARCHITECTURE.md invariant 5)."""

from relax_straggler.reporters.base import HangEvent, Sink
from relax_straggler.reporters.callback import CallbackSink, tensorboard
from relax_straggler.reporters.console import ConsoleSink
from relax_straggler.reporters.jsonl import JsonlSink
from relax_straggler.reporters.pipeline import ReportPipeline
from relax_straggler.reporters.summary import RunSummary

__all__ = ["CallbackSink", "ConsoleSink", "HangEvent", "JsonlSink", "ReportPipeline", "RunSummary", "Sink",
           "tensorboard"]

"""The sinks a StragglerConfig asks for, built in one place: for the metrics rank's run
(the analyzer) and for a rank that answers a hang in place of a stopped metrics rank
(relax_straggler.hang.publish), so both write the same outputs the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from relax_straggler.config import StragglerConfig
from relax_straggler.reporters.base import Sink
from relax_straggler.reporters.callback import CallbackSink, ReportFn
from relax_straggler.reporters.console import ConsoleSink
from relax_straggler.reporters.jsonl import JsonlSink
from relax_straggler.reporters.narrator import Narrator
from relax_straggler.reporters.summary import RunSummary

if TYPE_CHECKING:
    from relax_straggler.reporters.store_sink import StoreSink


@dataclass(frozen=True)
class ConfiguredSinks:
    """sinks: every sink, in the order they are given each item; summary, store, narrator:
    those of them the caller reads besides (None when not built)."""

    sinks: tuple[Sink, ...]
    summary: Optional[RunSummary] = None
    store: Optional[StoreSink] = None
    narrator: Optional[Narrator] = None


def build_sinks(config: StragglerConfig, report_fn: Optional[ReportFn] = None, *,
                for_run: bool = True) -> ConfiguredSinks:
    """The sinks `config` asks for, in this order: the run summary, report_fn's callback,
    the JSONL file (config.jsonl_path), the metrics store (config.store_url), the console
    (config.console, config.console_verbose) and the narrator (the `relax_straggler`
    logger's lines, unless config.quiet; it leaves the verdict's changes to the console
    when that is on).

    for_run: the metrics rank's sinks for the whole run. False: the outputs alone, for one
    hang answer given by a rank other than the metrics rank: no summary, no narrator, and
    closing the store marks no end of the run.
    Raises OSError when the JSONL file cannot be opened, ValueError for a bad store URL.
    """
    summary = RunSummary() if for_run else None
    sinks: list[Sink] = [summary] if summary is not None else []
    if report_fn is not None:
        sinks.append(CallbackSink(report_fn))
    if config.jsonl_path:
        sinks.append(JsonlSink(config.jsonl_path))
    store = None
    if config.store_url:
        from relax_straggler.reporters.store_sink import StoreSink  # the monitor's modules only when asked

        store = StoreSink(config.store_url, marks_end=for_run)
        sinks.append(store)
    if config.console:
        sinks.append(ConsoleSink(verbose=config.console_verbose))
    narrator = Narrator(transitions=not config.console) if for_run and not config.quiet else None
    if narrator is not None:
        sinks.append(narrator)
    return ConfiguredSinks(tuple(sinks), summary, store, narrator)


def describe_outputs(config: StragglerConfig, report_fn: Optional[ReportFn] = None) -> list[str]:
    """Where build_sinks(config, report_fn) sends reports, in words (the narrator's start-up
    line): "report_fn", the JSONL path, the store URL without its password, "the console"."""
    out = ["report_fn"] if report_fn is not None else []
    if config.jsonl_path:
        out.append(config.jsonl_path)
    if config.store_url:
        from relax_straggler.stores.url import redact

        out.append(redact(config.store_url))
    if config.console:
        out.append("the console")
    return out

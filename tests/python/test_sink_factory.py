"""The sinks a config asks for, built in one place (relax_straggler/reporters/factory.py):
the metrics rank's for the run, and the outputs alone for a rank answering a hang."""

from __future__ import annotations

from relax_straggler.config import StragglerConfig
from relax_straggler.reporters.factory import build_sinks, describe_outputs


def names(configured) -> list[str]:
    return [type(s).__name__ for s in configured.sinks]


def test_the_run_gets_every_configured_sink_and_a_stand_in_the_outputs_alone(tmp_path):
    config = StragglerConfig(enabled=True, console=True, console_verbose=True, jsonl_path=str(tmp_path / "s.jsonl"),
                             store_url=f"file://{tmp_path}/store?job=j")
    run = build_sinks(config, report_fn=lambda metrics, step: None)
    stand_in = build_sinks(config, for_run=False)
    try:
        assert names(run) == ["RunSummary", "CallbackSink", "JsonlSink", "StoreSink", "ConsoleSink", "Narrator"]
        assert (run.summary, run.store, run.narrator) == (run.sinks[0], run.sinks[3], run.sinks[5])
        assert names(stand_in) == ["JsonlSink", "StoreSink", "ConsoleSink"]
        assert (stand_in.summary, stand_in.narrator) == (None, None)
        assert run.sinks[4].verbose and stand_in.sinks[2].verbose
    finally:
        for sink in run.sinks + stand_in.sinks:
            sink.close(5.0)


def test_quiet_drops_the_narrator_and_no_output_leaves_the_summary():
    assert names(build_sinks(StragglerConfig(enabled=True, quiet=True))) == ["RunSummary"]
    assert names(build_sinks(StragglerConfig(enabled=True))) == ["RunSummary", "Narrator"]
    assert names(build_sinks(StragglerConfig(enabled=True), for_run=False)) == []


def test_the_outputs_in_words_hide_the_store_password(tmp_path):
    config = StragglerConfig(enabled=True, console=True, jsonl_path="r.jsonl",
                             store_url="clickhouse://ops:secret@h:8123/db?job=j")
    assert describe_outputs(config, report_fn=print) == ["report_fn", "r.jsonl", "clickhouse://ops:***@h:8123/db?job=j",
                                                         "the console"]

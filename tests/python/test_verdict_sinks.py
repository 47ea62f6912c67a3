"""What people see of the confirmed verdict: the console announces changes only (the table
with verbose), the run summary's headline comes from the verdict, the JSONL line and the
store sink's rows carry it."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np

import relax_straggler.common.stages

from relax_straggler.judge.confirm import Facts, Finding, VerdictResult
from relax_straggler.judge.report import Report
from relax_straggler.readers.metrics_rows import StoreSource
from relax_straggler.reporters import ConsoleSink, JsonlSink, RunSummary
from relax_straggler.reporters.narrator import summary_lines
from relax_straggler.reporters.store_sink import StoreSink
from relax_straggler.stores import verdict_rows
from relax_straggler.stores.base import Sample
from relax_straggler.stores.opener import open_store

STAGES = ("forward", "backward")
STAGES_ALL = relax_straggler.common.stages.STAGES


def finding(state: str, rank: int = 1, since: int = 40, ratio: float = 1.3) -> Finding:
    facts = Facts(rank_ms=13.0, ref_ms=10.0, excess_ms=3.0, median_ratio=ratio, noise=0.01, wait_caused_ms=0.0,
                  waiting_ranks=(), reports_agreeing=3, reports_seen=3, window_votes=0)
    return Finding(rank=rank, group=0, stage="forward", state=state, since_step=since, confidence=1.0, ratio=ratio,
                   persistent=True, by_window=False, facts=facts, cause="compute")


def report(step: int, *findings: Finding) -> Report:
    status = findings[0].state if findings else "healthy"
    ms = np.array([[10.0, 20.0], [13.0, 20.0]])
    metrics = {f"straggler/{s}/{k}": v for s in STAGES
               for k, v in (("mean_ms", 11.5), ("max_ms", 13.0), ("slowdown_ratio", 1.13), ("top_rank", 1),
                            ("ref_ms", 11.5))}
    return Report(step=step, stages=STAGES, device_ms=ms, judged_ms=ms, tokens=None, stragglers={}, likely_bottleneck=None,
                  top_ranks={}, hints="no straggler", metrics=metrics,
                  verdict=VerdictResult(step=step, status=status, findings=tuple(findings), unjudged_ranks=(),
                                        reports=step // 10, reset=False))


def test_the_console_announces_a_confirmation_once_then_the_recovery():
    out = io.StringIO()
    sink = ConsoleSink(out)
    for r in (report(10), report(20, finding("suspected")), report(40, finding("straggler")),
              report(50, finding("straggler")), report(60, finding("recovered", since=60)), report(70)):
        sink.write(r)
    lines = out.getvalue().splitlines()
    assert lines == [
        "[straggler] step 40: rank 1 straggler in forward since step 40: 1.30x its group, 3 of 3 reports; cause: compute",
        "[straggler] step 60: rank 1 recovered in forward since step 60: 1.30x its group, 3 of 3 reports; cause: compute",
        "[straggler] step 70: healthy: no rank is slow beyond its group's noise",
    ]


def test_a_healthy_run_prints_nothing_without_verbose_and_the_table_with_it():
    quiet, loud = io.StringIO(), io.StringIO()
    for r in (report(10), report(20), report(30, finding("suspected"))):
        ConsoleSink(quiet).write(r)
    sink = ConsoleSink(loud, verbose=True)
    sink.write(report(30, finding("suspected")))
    assert quiet.getvalue() == ""
    text = loud.getvalue()
    assert "rank 1 suspected in forward" in text and "mean ms" in text and "forward" in text


def test_the_summary_headline_names_the_confirmed_straggler():
    summary = RunSummary()
    assert summary.headline() == "no straggler confirmed in 0 reports"
    for r in (report(10), report(20, finding("suspected")), report(40, finding("straggler", ratio=1.2)),
              report(50, finding("straggler", ratio=1.4)), report(60, finding("straggler", ratio=1.5)), report(70)):
        summary.write(r)
    (c,) = summary.confirmed()
    assert (c.rank, c.stage, c.first_step, c.reports, c.reports_after, c.cause, c.median_excess_ms) == \
        (1, "forward", 40, 3, 4, "compute", 3.0)
    assert c.ratio == 1.5  # the finding's own ratio in the last report that named it, not a median of medians
    # Released before the run's last report: the headline and the line say when, not "confirmed" alone.
    assert (c.last_step, c.to_end) == (60, False)
    assert summary.headline() == ("straggler rank 1 confirmed from step 40 (named in 3 of 4 reports since), costing most "
                                  "in forward: 1.50x its group, +3.0 ms; cause: compute; released after step 60")
    assert str(c).endswith("cause: compute), released after step 60")
    summary.write(report(80, finding("straggler", ratio=1.4)))
    (c,) = summary.confirmed()
    assert c.to_end and summary.headline().endswith("; cause: compute") and str(c).endswith("cause: compute)")
    assert summary.statuses == {"healthy": 2, "suspected": 1, "straggler": 4}


def test_the_headline_counts_the_reports_naming_the_rank_in_any_stage_and_says_until_when_a_stage_was():
    # Rank 1 in backward (the costlier) from step 20 to 40, in forward from 30 to the end.
    back = dataclasses.replace(finding("straggler", since=20), stage="backward",
                               facts=dataclasses.replace(finding("straggler").facts, excess_ms=5.0))
    summary = RunSummary()
    summary.write(report(10))
    for step in range(20, 110, 10):
        summary.write(report(step, *([back] if step <= 40 else []),
                             *([finding("straggler", since=30)] if step >= 30 else [])))
    assert summary.headline() == ("straggler rank 1 confirmed from step 20 (named in 9 of 9 reports since), costing "
                                  "most in backward until step 40: 1.30x its group, +5.0 ms; also in forward; "
                                  "cause: compute")


def test_the_headline_is_about_the_straggler_still_named_at_the_end_and_the_lines_do_not_repeat_it():
    # Rank 1 confirmed in forward for steps 20-50 (released), rank 2 from step 60 to the end.
    summary = RunSummary()
    for step in range(10, 100, 10):
        summary.write(report(step, *([finding("straggler", rank=1, since=20)] if 20 <= step <= 50 else []),
                             *([finding("straggler", rank=2, since=60)] if step >= 60 else [])))
    assert summary.headline().startswith("straggler rank 2 confirmed from step 60 (named in 4 of 4 reports since)")
    assert not summary.headline().endswith("released after step 50")
    lines = summary_lines(summary)
    assert lines[1:] == ["         also straggler rank 1 confirmed in forward from step 20 (named in 4 of 8 reports "
                         "since, 1.30x its group; cause: compute), released after step 50"]


def test_the_jsonl_line_carries_the_verdict(tmp_path):
    sink = JsonlSink(str(tmp_path / "s.jsonl"))
    sink.write(report(40, finding("straggler")))
    sink.close()
    line = json.loads((tmp_path / "s.jsonl").read_text())
    assert line["verdict"]["status"] == "straggler"
    (f,) = line["verdict"]["findings"]
    assert (f["rank"], f["stage"], f["state"], f["cause"], f["facts"]["excess_ms"]) == (1, "forward", "straggler",
                                                                                         "compute", 3.0)


def test_the_store_sink_writes_the_verdict_the_monitor_reads_back(tmp_path):
    sink = StoreSink(f"file://{tmp_path}/store?job=v", flush_interval_s=0.05)
    sink.write(report(30, finding("suspected")))
    imbalance = Finding(rank=-1, group=1, stage="backward", state="imbalance", since_step=20, confidence=0.75,
                        ratio=1.5, persistent=True, by_window=False, cause="imbalance",
                        facts=finding("straggler").facts)
    sink.write(report(40, finding("straggler", ratio=1.3), imbalance))
    assert sink.flush(timeout_s=30)
    sink.close()
    store = open_store(f"file://{tmp_path}/store")
    try:
        v = verdict_rows.latest_verdict(store.samples("v", 0, 100))
        assert (v["step"], v["status"], v["rank"], v["stage"], v["cause"], v["since_step"], v["ratio"]) == \
            (40, "straggler", 1, "forward", "compute", 40, 1.3)
        assert [(f["state"], f["rank"], f["group"], f["stage"], f["excess_ms"], f["reports_seen"]) for f in v["findings"]] \
            == [("straggler", 1, 0, "forward", 3.0, 3), ("imbalance", -1, 1, "backward", 3.0, 3)]
        # The timer reader reads the same rows: the verdict's are known and no stage.
        source = StoreSource(store, "v", 0, 100)
        steps = list(source.steps())
        assert [s.step for s in steps] == [30, 40] and source.unknown == {} and source.problems.total == 0
        assert steps[1].ms[:, 0].tolist() == [10.0, 13.0]
    finally:
        store.close()


def test_a_malformed_verdict_row_is_refused_naming_it():
    row = Sample(timestamp=1.0, job="v", metric_name="straggler/verdict", rank=0, iteration=7, values=(1.0,),
                 subname="straggler|forward|compute")
    try:
        verdict_rows.decode(row)
    except ValueError as exc:
        assert "iteration 7" in str(exc) and "1 values, expected 4" in str(exc)
    else:
        raise AssertionError("a verdict row with one value was accepted")
    assert verdict_rows.decode(Sample(timestamp=1.0, job="v", metric_name="forward-compute", rank=0, iteration=7,
                                      values=(1.0,))) is None


def test_a_stage_some_reports_lack_does_not_start_the_verdict_over():
    # A broadcast every other report (communication/broadcast comes and goes): fed the full
    # stage set, the verdict keeps its evidence and confirms the slow rank.
    from relax_straggler.judge.columns import all_stages
    from relax_straggler.judge.confirm import ConfirmedVerdict

    rng = np.random.default_rng(3)
    verdict = ConfirmedVerdict()
    for step in range(12):
        stages = ("forward", "backward") + (("communication/broadcast",) if step % 2 else ())
        ms = 40.0 * rng.lognormal(0.0, 0.01, (4, len(stages)))
        ms[2, 0] *= 1.5
        result = verdict.update(step, all_stages(ms, stages), STAGES_ALL, groups=[0, 0, 0, 0])
        assert not result.reset or step == 0
    assert result.straggler_ranks == (2,)

"""A rank kept waiting for a CPU is host contention offline as live: the JSONL carries each
rank's run-queue wait of the sampled step, and `analyze` replays the confirmed verdict with
it, so its confirmed straggler reads the cause the live verdict gave (host_contention, not
compute). A malformed wait list is a problem of its line; the step's times stay."""

from __future__ import annotations

import json

import numpy as np

from relax_straggler.cli import main
from relax_straggler.judge.confirm import ConfirmedVerdict
from relax_straggler.judge.report import Report
from relax_straggler.readers.base import Problems
from relax_straggler.readers.straggler_jsonl import StragglerJsonlReader
from relax_straggler.reporters import JsonlSink

STAGES = ("forward", "backward", "communication")
RANKS, SLOW, ONSET = 4, 1, 6


def reports(contended: bool, seed: int = 3, until: int = 20) -> list[Report]:
    """20 reports through the live verdict: rank 1's forward 1.6x from report 6 to `until`; with
    `contended` its training thread waited for a CPU as long as its excess (host contention),
    else no longer than its peers (its own slow compute)."""
    rng = np.random.default_rng(seed)
    verdict, out = ConfirmedVerdict(), []
    for step in range(20):
        ms = np.empty((RANKS, 3))
        ms[:, 0] = 40.0 * np.exp(rng.normal(0, 0.01, RANKS))
        ms[:, 1] = 80.0 * np.exp(rng.normal(0, 0.01, RANKS))
        waits = rng.uniform(0.2, 0.6, RANKS)
        if ONSET <= step < until:
            excess = 0.6 * ms[SLOW, 0]
            ms[SLOW, 0] += excess
            waits[SLOW] += excess if contended else 0.0
        arrive = ms[:, 0] + ms[:, 1]
        ms[:, 2] = 20.0 + arrive.max() - arrive
        result = verdict.update(step, ms, STAGES, run_queue_ms=waits)
        out.append(Report(step=step, stages=STAGES, device_ms=ms, judged_ms=ms, tokens=None, stragglers={},
                          likely_bottleneck=None, top_ranks={}, hints="", metrics=result.metrics(), verdict=result,
                          run_queue_ms=waits))
    return out


def live_cause(report: Report) -> str:
    (f,) = [f for f in report.verdict.findings if f.rank == SLOW and f.stage == "forward" and f.state == "straggler"]
    return f.cause


def test_analyze_gives_the_live_verdicts_cause_host_contention_or_compute(tmp_path, capsys):
    for contended, cause in ((True, "host_contention"), (False, "compute")):
        path = tmp_path / f"{cause}.jsonl"
        sink = JsonlSink(str(path))
        run = reports(contended)
        for r in run:
            sink.write(r)
        sink.close()
        assert live_cause(run[-1]) == cause
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        assert rows[-1]["run_queue_ms"] == run[-1].run_queue_ms.tolist()

        assert main(["analyze", str(path), "--format", "json"]) == 0
        offline = json.loads(capsys.readouterr().out)
        (named,) = offline["confirmed"]["stragglers"]
        assert (named["rank"], named["stage"], named["cause"]) == (SLOW, "forward", cause), offline["confirmed"]


def test_a_recovered_finding_keeps_the_cause_it_was_confirmed_with():
    run = reports(True, until=13)
    states = [(f.state, f.cause) for r in run for f in r.verdict.findings if f.rank == SLOW and f.stage == "forward"]
    assert ("straggler", "host_contention") in states
    recovered = [cause for state, cause in states if state == "recovered"]
    assert recovered and set(recovered) == {"host_contention"}, states


def test_a_malformed_run_queue_list_is_a_problem_of_its_line_that_keeps_the_steps_times(tmp_path):
    good = {"step": 1, "stages": ["forward"], "device_ms": [[1.0], [2.0]], "run_queue_ms": [0.5, None]}
    bad = [dict(good, step=2, run_queue_ms=[0.5]), dict(good, step=3, run_queue_ms=[-1.0, 0.0]),
           dict(good, step=4, run_queue_ms="0.5"), dict(good, step=5, run_queue_ms=[0.0, 1e300])]
    path = tmp_path / "straggler.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [good, *bad]) + "\n")
    problems = Problems(str(path))
    steps = list(StragglerJsonlReader(str(path), problems).steps())
    assert [s.step for s in steps] == [1, 2, 3, 4, 5]  # nothing skipped: the times stand
    assert steps[0].run_queue_ms[0] == 0.5 and np.isnan(steps[0].run_queue_ms[1])
    assert all(s.run_queue_ms is None for s in steps[1:])
    assert problems.counts["malformed"] == 4 and problems.skipped == 0
    assert [p.line for p in problems.kept] == [2, 3, 4, 5]
    assert all("'run_queue_ms'" in p.message for p in problems.kept)
    assert "run_queue_ms[0]: -1.0" in problems.kept[1].message and "run_queue_ms[1]: 1e+300" in problems.kept[3].message


def test_a_report_without_waits_keeps_the_later_ones_aligned_with_their_reports():
    # Rank 1 waits 30 ms for a CPU in reports 0-5 while not slow, then is 1.6x slow in forward
    # with no wait beyond its peers'; reports 6-9 carry no waits (a malformed list offline).
    # Its cause is compute: the waits of reports 0-5 are not those of the reports agreeing.
    rng = np.random.default_rng(4)
    verdict = ConfirmedVerdict()
    for step in range(20):
        ms = np.empty((RANKS, 3))
        ms[:, 0] = 40.0 * np.exp(rng.normal(0, 0.01, RANKS))
        ms[:, 1] = 80.0 * np.exp(rng.normal(0, 0.01, RANKS))
        waits = rng.uniform(0.2, 0.6, RANKS)
        if step < ONSET:
            waits[SLOW] += 30.0
        else:
            ms[SLOW, 0] *= 1.6
        arrive = ms[:, 0] + ms[:, 1]
        ms[:, 2] = 20.0 + arrive.max() - arrive
        result = verdict.update(step, ms, STAGES, run_queue_ms=None if ONSET <= step < 10 else waits)
        for f in result.findings:
            if f.rank == SLOW and f.stage == "forward" and f.state == "straggler":
                assert f.cause == "compute", (step, f.cause, f.facts.run_queue_excess_ms)
    assert any(f.state == "straggler" for f in result.findings)


def test_a_skipped_line_has_one_problem_whatever_its_waits(tmp_path):
    line = {"step": 1, "stages": ["forward"], "device_ms": [[1.0], [2.0]], "run_queue_ms": [0.5, 0.1]}
    path = tmp_path / "straggler.jsonl"
    path.write_text(json.dumps(line) + "\n" + json.dumps(dict(line, run_queue_ms=[-1.0, 0.0])) + "\n")
    problems = Problems(str(path))
    assert [s.step for s in StragglerJsonlReader(str(path), problems).steps()] == [1]
    assert dict(problems.counts) == {"duplicate": 1} and "repeats" in problems.kept[0].message

"""Garbage-collection pauses: measured on every step, gathered with the sampled row, and the
cause they support (relax_straggler.live.gc_pauses, relax_straggler.judge.confirm)."""

import gc
import json
import math

import numpy as np
import pytest
from conftest import DETECTION, REAL_RUNS, REPO, read_jsonl, torchrun
from workers.step_times import assert_not_blocked

from relax_straggler.common.payload import GC_FIELDS, GcPauseRows, pack, unpack
from relax_straggler.common.stages import STAGES as ALL_STAGES
from relax_straggler.judge.confirm import GC_SHARE, ConfirmedVerdict
from relax_straggler.live.gc_pauses import GcPauses


def cycles(n: int) -> None:
    """n reference cycles left for the collector."""
    for _ in range(n):
        a: list = []
        a.append(a)


def test_every_collection_between_two_takes_is_counted_by_generation_with_the_steps_it_spans():
    pauses = GcPauses()
    pauses.install()
    try:
        pauses.take(9)  # the previous sampled row: steps 0-9
        for _ in range(3):  # unsampled steps 10-18: collections there count in the next row
            cycles(100)
            gc.collect(0)
        gc.collect(2)
        pauses.mark(19)  # the sampled step
        gc.collect(1)
        row = dict(zip(GC_FIELDS, pauses.take(19)))
    finally:
        pauses.remove()
    assert row["gc_steps"] == 10
    assert row["gc_count"] >= 5  # at least the 5 asked for (young ones may add to them)
    assert row["gc_full_count"] >= 1
    assert row["gc_ms"] >= row["gc_full_ms"] > 0
    assert 0 < row["gc_step_ms"] <= row["gc_ms"]
    assert pauses._on_gc not in gc.callbacks


def test_a_step_not_marked_has_no_in_step_pause_and_an_uninstalled_clock_measures_nothing():
    pauses = GcPauses()
    assert np.isnan(pauses.take(3)).all()  # not installed: not measured
    pauses.install()
    pauses.install()  # once only
    try:
        assert gc.callbacks.count(pauses._on_gc) == 1
        pauses.mark(4)
        row = dict(zip(GC_FIELDS, pauses.take(5)))
        assert math.isnan(row["gc_step_ms"]) and row["gc_steps"] == 6  # the first row counts from step 0
    finally:
        pauses.remove()
        pauses.remove()  # safe twice


def test_the_callback_never_raises_into_the_interpreter():
    pauses = GcPauses()
    pauses._on_gc("stop", {"generation": 2})  # a stop without its start: nothing counted
    pauses._on_gc("start", {})
    pauses._on_gc("stop", {})  # no generation: swallowed, not counted
    pauses._on_gc("start", {})
    pauses._on_gc("stop", {"generation": 7})  # a future interpreter's extra generation: counted as full
    assert pauses.totals()[1] == 1 and pauses.totals()[3] == 1


def test_the_gc_fields_travel_in_the_row():
    n = len(ALL_STAGES)
    nan = [math.nan] * n
    fields = [120.0, 400.0, 110.0, 1.0, 10.0, 2.5]
    rows = np.stack([pack(5, 1.0, r, nan, nan, nan, nan, gc=fields if r else None) for r in range(2)])
    got = unpack(rows).gc
    assert np.isnan(got.matrix()[0]).all()
    np.testing.assert_array_equal(got.matrix()[1], fields)
    with pytest.raises(ValueError, match=r"gc must have shape \(6,\)"):
        pack(5, 1.0, 0, nan, nan, nan, nan, gc=[1.0])


STAGES = ("forward",)
INTERVAL = 10  # steps between two sampled rows


def run(slow_ms: float, gc_per_step: dict[int, float], in_step: dict[int, list[float]] | None = None,
        run_queue: dict[int, float] | None = None, last_ms: float = 0.0, reports: int = 10, seed: int = 5):
    """Feeds `reports` reports of 4 ranks, forward 50 ms +- 1 % noise, rank 1 slower by
    slow_ms from the 4th report on and by last_ms more in the last; each rank's rows say it paused gc_per_step[r] ms a step
    (others 0.5) over the INTERVAL steps since its previous row, in_step[r][k] ms of it
    in the sampled step itself (others 0); run_queue[r]: its wait for a CPU (others 1 ms)."""
    rng = np.random.default_rng(seed)
    verdict = ConfirmedVerdict()
    results = []
    for k in range(reports):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        if k >= 3:
            ms[1, 0] += slow_ms + (last_ms if k == reports - 1 else 0.0)
        per_step = np.array([gc_per_step.get(r, 0.5) for r in range(4)])
        step_ms = np.array([(in_step or {}).get(r, [0.0] * reports)[k] for r in range(4)])
        rows = GcPauseRows(gc_ms=per_step * INTERVAL, gc_count=np.full(4, 40.0 * INTERVAL),
                           gc_full_ms=np.where(per_step > 1, per_step * INTERVAL, 0.0),
                           gc_full_count=(per_step > 1).astype(float), gc_steps=np.full(4, float(INTERVAL)),
                           gc_step_ms=step_ms)
        wait = np.array([(run_queue or {}).get(r, 1.0) for r in range(4)])
        results.append(verdict.update(k, ms, STAGES, gc=rows, run_queue_ms=wait if run_queue else None))
    return results


def straggler(result):
    (f,) = [f for f in result.findings if f.state == "straggler"]
    return f


def test_a_rank_whose_pauses_per_step_explain_its_excess_is_gc_with_the_pause_time_in_its_facts():
    f = straggler(run(slow_ms=12.0, gc_per_step={1: 9.0})[-1])
    assert (f.rank, f.cause) == (1, "gc")
    # Pooled over the reports agreeing with the finding: their steps, their pause time.
    assert f.facts.gc_steps == INTERVAL * f.facts.reports_agreeing
    assert f.facts.gc_ms == pytest.approx(9.0 * f.facts.gc_steps)
    assert f.facts.gc_full_count == f.facts.reports_agreeing
    assert f.facts.gc_excess_ms == pytest.approx(8.5)  # beyond the others' 0.5 ms a step
    assert f.facts.gc_excess_ms >= GC_SHARE * f.facts.excess_ms
    assert "garbage collections" in f.describe() and f.describe().endswith("cause: gc")


def test_pauses_that_explain_less_than_half_leave_the_cause_as_it_was():
    f = straggler(run(slow_ms=12.0, gc_per_step={1: 4.0})[-1])  # 3.5 ms of ~12
    assert f.cause == "compute" and "garbage" not in f.describe()  # its pauses are in its facts
    assert f.facts.gc_excess_ms == pytest.approx(3.5)


def test_pauses_that_land_on_the_sampled_steps_explain_their_excess():
    # Rank 1 pauses 3 ms a step on average, but in every sampled step from the slowdown on
    # one full collection of 10 ms lands: most of that step's 12 ms excess.
    results = run(slow_ms=12.0, gc_per_step={1: 3.0}, in_step={1: [0.0] * 3 + [10.0] * 7})
    f = straggler(results[-1])
    assert f.cause == "gc" and f.facts.gc_step_ms == 10.0 and f.facts.gc_step_excess_ms == 10.0


def test_one_pause_on_a_sampled_step_does_not_recast_a_confirmed_finding():
    # The same rank computing 12 ms more, and in the latest sampled step only a full
    # collection of 40 ms (of its 52 ms excess there): a fact of the finding, whose cause
    # changes only when confirm_reports reports in a row read another.
    results = run(slow_ms=12.0, gc_per_step={1: 3.0}, in_step={1: [0.0] * 9 + [40.0]}, last_ms=40.0)
    assert straggler(results[-2]).cause == "compute"
    f = straggler(results[-1])
    assert f.cause == "compute" and f.facts.gc_step_ms == 40.0 and f.facts.gc_step_excess_ms == 40.0


def test_a_pause_in_a_report_without_the_findings_evidence_does_not_change_its_cause():
    # In the latest report rank 1 is 2 ms faster than its peers (still listed: 2 reports
    # without evidence release it) and paused 2 ms in the sampled step: half of a negative
    # excess is no explanation, the cause stays the one its evidence gave.
    results = run(slow_ms=12.0, gc_per_step={}, in_step={1: [0.0] * 9 + [2.0]}, last_ms=-14.0)
    f = straggler(results[-1])
    assert f.facts.excess_ms < 0 and f.facts.gc_step_excess_ms == 2.0, f
    assert f.cause == "compute", f


def test_the_larger_measured_explanation_names_the_cause():
    f = straggler(run(slow_ms=12.0, gc_per_step={1: 9.0}, run_queue={1: 8.0})[-1])
    assert f.cause == "gc"  # 8.5 ms of pauses beyond the group against 7 ms of waiting for a CPU
    f = straggler(run(slow_ms=12.0, gc_per_step={1: 7.0}, run_queue={1: 10.0})[-1])
    assert f.cause == "host_contention" and f.facts.gc_excess_ms == pytest.approx(6.5)


def test_every_finding_of_a_report_gets_its_gc_facts():
    # Ranks 1 and 2 both slow: two findings in one report, each with its own pauses.
    rng = np.random.default_rng(5)
    verdict = ConfirmedVerdict()
    for k in range(8):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        ms[1:3, 0] += 12.0 if k >= 3 else 0.0
        rows = GcPauseRows(gc_ms=np.full(4, 5.0), gc_count=np.full(4, 40.0), gc_full_ms=np.zeros(4),
                           gc_full_count=np.zeros(4), gc_steps=np.full(4, float(INTERVAL)),
                           gc_step_ms=np.array([0.0, 1.0, 2.0, 0.0]))
        result = verdict.update(k, ms, STAGES, gc=rows)
    steps = {f.rank: f.facts.gc_step_ms for f in result.findings if f.state == "straggler"}
    assert steps == {1: 1.0, 2: 2.0}, result.findings


def test_gc_rows_of_the_wrong_shape_are_refused():
    rows = GcPauseRows(*(np.zeros(3) for _ in GC_FIELDS))
    with pytest.raises(ValueError, match=r"gc has shape \(3, 6\), expected \(4, 6\)"):
        ConfirmedVerdict().update(0, np.full((4, 1), 50.0), STAGES, gc=rows)


GROWING = 1  # the rank whose cache grows
WARMUP = 10  # the first full collection of the growing rank lands here (its 8th step or so)


@REAL_RUNS
@DETECTION
def test_a_rank_whose_cache_only_grows_is_confirmed_for_its_gc_pauses_and_its_peer_never(tmp_path):
    out, jsonl = tmp_path / "run.json", tmp_path / "straggler.jsonl"
    # 10 reports: a healthy phase on a loaded host teaches the verdict a longer streak than the
    # 3 reports a quiet one asks (docs/DETECTION.md, States).
    steps, interval = 60, 5
    torchrun(2, REPO / "tests" / "python" / "workers" / "gc_pauses.py",
             [str(out), str(jsonl), str(steps), str(interval), str(WARMUP), str(GROWING)])
    ranks = json.loads(out.read_text())
    # The growing rank's full collections are the workload's own, and its peer waits for them
    # at the all-reduce of the same step: each step is judged less the longest pause any rank
    # took in it (1-2.5 s each on a crowded host, growing with the heap).
    pause = np.max([x["gc_s"] for x in ranks], axis=0)
    assert_not_blocked({r: list(np.subtract(x["step_s"], pause)) for r, x in enumerate(ranks)}, warmup=WARMUP,
                       expected_steps=steps)
    reports = read_jsonl(jsonl)
    findings = [f for r in reports for f in r["verdict"]["findings"] if f["state"] == "straggler"]
    # A rank the crowded host keeps waiting for a CPU is named for host_contention: not what
    # this run injects (tests/python/test_run_queue.py).
    assert [f for f in findings if f["rank"] != GROWING and f["cause"] != "host_contention"] == [], findings
    forward = [f for f in findings if f["rank"] == GROWING and f["stage"] == "forward"]
    assert forward and all(f["cause"] == "gc" for f in forward), [(r["step"], r["verdict"]) for r in reports]
    facts = forward[-1]["facts"]
    assert facts["gc_full_count"] >= 1 and facts["gc_ms"] > facts["gc_full_ms"] > 0, facts
    assert facts["gc_excess_ms"] > 0, facts
    last = [(f["rank"], f["stage"], f["cause"]) for f in reports[-1]["verdict"]["findings"] if f["state"] == "straggler"]
    assert (GROWING, "forward", "gc") in last, reports[-1]["verdict"]

"""Time outside timed sections: measured per rank and sampled step as the `untimed` stage, and
blamed on the rank that spends it, never on the rank that waits for it at a collective."""

import json
import math
import time

import numpy as np
import pytest

from conftest import DETECTION, REAL_RUNS, REPO, assert_every_sample_reported, read_jsonl, torchrun
from relax_straggler._ext import ext
from relax_straggler.common.payload import row_from_sample, unpack
from relax_straggler.common.stages import STAGES, stage_id
from truth import MIN_RATIO, median_ratio
from workers.step_times import assert_not_blocked

WORKER = REPO / "tests" / "python" / "workers" / "untimed_spin.py"
FORWARD, UNTIMED = stage_id("forward"), stage_id("untimed")


def timer():
    return ext().StageTimer(len(STAGES), 1, 0, 1024, False)


def test_untimed_is_the_step_less_its_sections_and_collectives():
    t = timer()
    t.begin_step(0)
    time.sleep(0.02)  # outside
    t.start(FORWARD)
    time.sleep(0.03)
    t.stop(FORWARD)
    token = t.comm_begin(ext().CommOp.ALLREDUCE, True, 8)  # an async collective, then waited for outside a section
    time.sleep(0.03)
    t.comm_end(token)
    sample = t.end_step()
    forward = sample.device_ms[FORWARD]
    assert 30.0 <= forward
    # The sleeps are floors: a loaded host only lengthens them, and the time between the
    # calls is a few microseconds.
    assert 20.0 <= sample.untimed_ms < 20.0 + 15.0, sample.untimed_ms


def test_nested_and_overlapping_spans_are_taken_out_once():
    t = timer()
    t.begin_step(0)
    t.start(FORWARD)
    t.start(stage_id("attention"))
    token = t.comm_begin(ext().CommOp.ALLREDUCE, True, 8)  # in flight across the section's end
    time.sleep(0.02)
    t.stop(stage_id("attention"))
    t.stop(FORWARD)
    time.sleep(0.02)
    t.comm_end(token)
    time.sleep(0.01)  # outside everything
    sample = t.end_step()
    assert 10.0 <= sample.untimed_ms < 10.0 + 10.0, sample.untimed_ms


def test_unsampled_steps_measure_nothing_and_the_row_carries_the_stage():
    t = ext().StageTimer(len(STAGES), 2, 0, 1024, False)
    t.begin_step(1)
    assert math.isnan(t.end_step().untimed_ms)
    t.begin_step(2)
    time.sleep(0.005)
    sample = t.end_step()
    g = unpack(row_from_sample(sample, math.nan, 0)[None, :])
    assert g.device_ms[0, UNTIMED] == g.host_ms[0, UNTIMED] == sample.untimed_ms >= 5.0
    assert g.waited_ms[0, UNTIMED] == 0.0 and g.calls[0, UNTIMED] == 1.0
    # Without timed collectives a rank's waits on its peers fall outside its sections: the
    # stage is then not measured, or it would blame the rank that waits.
    blind = unpack(row_from_sample(sample, math.nan, 0, untimed=False)[None, :])
    assert math.isnan(blind.device_ms[0, UNTIMED]) and math.isnan(blind.host_ms[0, UNTIMED])


def test_untimed_is_no_section():
    from relax_straggler import StragglerConfig
    import relax_straggler

    analyzer = relax_straggler.install(None, None, config=StragglerConfig(enabled=True, console=False))
    try:
        with pytest.raises(ValueError, match="'untimed' is measured by the analyzer"):
            analyzer.section("untimed")
    finally:
        analyzer.uninstall()
    disabled = relax_straggler.install(None, None, config=StragglerConfig(enabled=False))
    with pytest.raises(ValueError, match="'untimed' is measured by the analyzer"):
        disabled.section("untimed")


def test_a_rank_slow_outside_sections_is_confirmed_there_with_its_own_cause_and_its_waiting_peer_is_not():
    # Two ranks, forward 10 ms each; from the 4th report rank 1 spends 30 ms more outside its
    # sections and arrives that much later at the all-reduce, where rank 0 waits for it.
    from relax_straggler.judge.confirm import ConfirmedVerdict

    rng = np.random.default_rng(5)
    stages = ("forward", "communication/allreduce", "untimed")
    verdict = ConfirmedVerdict()
    for k in range(12):
        ms = np.array([[10.0, 2.0, 0.5], [10.0, 2.0, 0.5]]) * (1 + 0.02 * rng.standard_normal((2, 3)))
        if k >= 3:
            ms[1, 2] += 30.0
            ms[0, 1] += 30.0  # rank 0 waits at the all-reduce: its time there is the longer
        result = verdict.update(k, ms, stages)
    named = [(f.rank, f.stage, f.cause) for f in result.findings if f.state == "straggler"]
    assert named == [(1, "untimed", "untimed_code")], result.findings
    assert 0 in result.primary.facts.waiting_ranks


# Multi-rank runs ---------------------------------------------------------------------------
# With 2 or 4 ranks on 2 shared cores, the spinning thread is descheduled for part of its
# spin; where that wait covers most of its excess the verdict says host_contention, which is
# measured and no link either (tests/python/test_run_queue.py).
OWN_CAUSES = {"untimed_code", "host_contention"}


def stragglers(report: dict) -> list[tuple[int, str, str]]:
    return [(f["rank"], f["stage"], f["cause"]) for f in report["verdict"]["findings"] if f["state"] == "straggler"]


def contended(report: dict) -> bool:
    """Whether the headline's cause is host contention: measured, and no wait on a peer."""
    return report["metrics"]["straggler/verdict/cause"] == "host_contention"


def headline(report: dict) -> tuple[int, str]:
    m = report["metrics"]
    return m["straggler/verdict/rank"], m["straggler/verdict/stage"]


@REAL_RUNS
@DETECTION
@pytest.mark.parametrize("nproc", [2, 4])
def test_the_rank_spinning_outside_sections_is_named_and_released_and_the_waiting_ranks_never(tmp_path, nproc):
    from workers.untimed_spin import INTERVAL, PHASES, STEPS, WARMUP

    torchrun(nproc, WORKER, [str(tmp_path)])
    steps = json.loads((tmp_path / "steps.json").read_text())
    assert_not_blocked(dict(enumerate(steps)), warmup=WARMUP, expected_steps=STEPS)
    reports = read_jsonl(tmp_path / "straggler.jsonl")
    by_step = {r["step"]: r for r in reports}
    skipped = reports[-1]["metrics"]["straggler/skipped_samples"]
    assert_every_sample_reported([r["step"] for r in reports], range(WARMUP, STEPS, INTERVAL), skipped)
    assert all(headline(r) == (-1, "none") for r in reports if r["step"] < PHASES[0][1])
    for where, first, end in PHASES:
        # A spin after the optimizer is in the next step's time: its phase's reports are one
        # step later (the report of its end step carries its last spin).
        shift = 1 if where == "after_optimizer" else 0
        slow = [by_step[s] for s in range(first, end + shift, INTERVAL) if s >= first + shift and s in by_step]
        # Confirmed in its untimed stage within the phase, 8 reports (3 in a row on a quiet
        # host; the streak a noisy host teaches is longer, up to 8: docs/DETECTION.md, States),
        # and the headline from then to the phase's end.
        named = [i for i, r in enumerate(slow) if headline(r) == (1, "untimed")]
        assert named, (where, [stragglers(r) for r in slow])
        assert named == list(range(named[0], len(slow))), (where, [headline(r) for r in slow])
        for r in slow[named[0]:]:
            assert r["metrics"]["straggler/verdict/cause"] in OWN_CAUSES, (where, r["verdict"])
        # Released after 2 reports without evidence (tests/python/test_release.py); on a loaded
        # host a report after the spin's end may still carry a few ms of it (its sub-ms stage
        # against a scheduling hiccup): the headline is no longer rank 1's untimed stage from
        # the 5th report on, unless the host keeps rank 1 slower there (host contention, or the
        # median of its raw untimed time over its peers' in the reports since the spin's end
        # still >= 1.05, tests/python/truth.py).
        following = next((f for _, f, _ in PHASES if f > first), STEPS)
        after = [by_step[s] for s in sorted(by_step) if end + shift <= s < following]

        since = reports.index(after[0]) if after else 0  # the reports from the spin's end on

        def still_slower(r: dict) -> bool:
            return median_ratio(reports, reports.index(r), 1, "untimed", range(nproc), since) >= MIN_RATIO

        assert len(after) >= 5 - skipped and all(headline(r) != (1, "untimed") or contended(r) or still_slower(r)
                                                 for r in after[4:]), \
            (where, [(headline(r), r["metrics"]["straggler/verdict/cause"]) for r in after])
    # Where it spins: once confirmed, the rank samples its stack, and its finding says where.
    where_found = [f["facts"]["stack"] for r in reports if r["step"] < PHASES[0][2]
                   for f in r["verdict"]["findings"] if f["rank"] == 1 and f["facts"].get("stack")]
    assert where_found, "no stack sample reached the verdict in the first phase"
    assert where_found[0]["frames"][0]["function"] == "spin_outside_sections", where_found[0]
    assert where_found[0]["frames"][0]["file"] == "untimed_spin.py"
    # The waits of the ranks waiting for it land in communication: nobody but rank 1 is ever
    # confirmed there, and nobody is named a link or unknown. (Their compute stages do not
    # hold the waits; what the crowded host does to those is the healthy-run tests' claim.)
    for r in reports:
        for rank, stage, cause in stragglers(r):
            assert cause not in ("communication_link", "unknown"), (r["step"], stragglers(r))
            assert rank == 1 or not stage.startswith("communication"), (r["step"], stragglers(r))

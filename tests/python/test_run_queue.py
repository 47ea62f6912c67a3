"""Host contention: the training thread's run-queue wait, measured, and the cause it supports."""

import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import DETECTION, ONE_AT_A_TIME
from relax_straggler.judge.confirm import HOST_CONTENTION_SHARE, ConfirmedVerdict, beyond_group
from relax_straggler.live.run_queue import RunQueueClock

pytestmark = [ONE_AT_A_TIME, DETECTION]  # measures CPU shares

linux_schedstat = pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="no Linux schedstat here")

SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])}); print(flush=True)\nwhile True: pass"


def spin_for(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@linux_schedstat
def test_a_thread_sharing_its_core_with_a_spinner_waits_and_a_sleeping_one_does_not():
    cpu = sorted(os.sched_getaffinity(0))[0]
    before = os.sched_getaffinity(0)
    spinner = subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)], stdout=subprocess.PIPE, text=True)
    try:
        spinner.stdout.readline()  # pinned and spinning
        os.sched_setaffinity(0, {cpu})
        clock = RunQueueClock()
        clock.start()
        spin_for(0.5)  # wall time: about half of it on the CPU, the rest waiting for it
        shared = clock.elapsed_ms()
        clock.start()
        time.sleep(0.5)  # not runnable: no wait
        asleep = clock.elapsed_ms()
    finally:
        os.sched_setaffinity(0, before)
        spinner.kill()
        spinner.wait()
    assert shared > 100.0, shared
    assert 0.0 <= asleep < 50.0, asleep


@linux_schedstat
def test_a_span_ended_on_another_thread_is_not_measured():
    import threading

    clock = RunQueueClock()
    clock.start()
    out = []
    t = threading.Thread(target=lambda: out.append(clock.elapsed_ms()))
    t.start()
    t.join()
    assert math.isnan(out[0])
    assert clock.elapsed_ms() >= 0.0


def test_beyond_group_is_the_wait_less_the_median_of_the_others_of_the_group():
    rng = np.random.default_rng(7)
    for _ in range(300):
        n = int(rng.integers(1, 9))
        wait = rng.integers(0, 6, n).astype(float)
        wait[rng.random(n) < 0.2] = np.nan
        groups = rng.integers(0, 3, n)
        expected = np.full(n, np.nan)
        for i in range(n):
            others = [wait[j] for j in range(n) if j != i and groups[j] == groups[i] and np.isfinite(wait[j])]
            if np.isfinite(wait[i]) and others:
                expected[i] = wait[i] - np.median(others)
        np.testing.assert_array_equal(beyond_group(wait, groups), expected)
    np.testing.assert_array_equal(beyond_group(np.array([1.0, 2.0, 3.0, 10.0])), [-2.0, -1.0, 1.0, 8.0])
    with pytest.raises(ValueError, match="3 ranks with 2 group ids"):
        beyond_group(np.zeros(3), [0, 1])


STAGES = ("forward",)


def verdicts(slow: dict[int, float], wait: dict[int, list[float]], reports: int = 10, seed: int = 3):
    """Feeds `reports` reports of 4 ranks, forward 50 ms +- 1 % noise, rank r slower by
    slow[r] ms from the 4th report on, with run-queue waits wait[r][k] ms (others ~2 ms)."""
    rng = np.random.default_rng(seed)
    verdict = ConfirmedVerdict()
    out = []
    for k in range(reports):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        rq = 2.0 + 0.2 * rng.standard_normal(4)
        if k >= 3:
            for r, extra in slow.items():
                ms[r, 0] += extra
        for r, series in wait.items():
            rq[r] = series[k]
        out.append(verdict.update(k, ms, STAGES, run_queue_ms=rq))
    return out


def confirmed(result):
    return [(f.rank, f.cause) for f in result.findings if f.state == "straggler"]


def test_a_rank_whose_excess_is_its_wait_for_a_cpu_is_host_contention_and_one_that_computes_more_is_not():
    waits = [2.0] * 3 + [14.0, 13.0, 15.0, 12.0, 14.0, 16.0, 13.0]  # ~12 ms more than its peers once slow
    results = verdicts({1: 12.0, 2: 12.0}, {1: waits})
    last = results[-1]
    assert sorted(confirmed(last)) == [(1, "host_contention"), (2, "compute")]
    contended = next(f for f in last.findings if f.rank == 1)
    assert contended.facts.run_queue_ms == 13.0
    assert contended.facts.run_queue_excess_ms >= HOST_CONTENTION_SHARE * contended.facts.excess_ms
    assert "ms more for a CPU than its group's; cause: host_contention" in contended.describe()
    computing = next(f for f in last.findings if f.rank == 2)
    assert abs(computing.facts.run_queue_excess_ms) < 1.0


def test_one_descheduled_report_does_not_make_a_compute_straggler_host_contention():
    waits = [2.0] * 9 + [40.0]  # the latest report only: the median over the finding's reports stays ~0
    last = verdicts({2: 12.0}, {2: waits})[-1]
    assert confirmed(last) == [(2, "compute")]


def test_a_report_without_the_findings_evidence_does_not_change_its_cause():
    # Rank 2 computes 12 ms more from the 4th report (cause compute); in the 10th it is as fast
    # as its peers but still listed (2 reports without evidence release it) and waited 1 ms
    # more for a CPU: its excess there is negative, and half of a negative excess is no
    # explanation. Its cause stays the one its evidence gave.
    rng = np.random.default_rng(3)
    verdict = ConfirmedVerdict()
    for k in range(10):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        ms[2, 0] += 12.0 if 3 <= k < 9 else -1.0
        rq = np.full(4, 2.0)
        rq[2] += 1.0 if k == 9 else 0.0
        result = verdict.update(k, ms, STAGES, run_queue_ms=rq)
    (f,) = [f for f in result.findings if f.rank == 2]
    assert f.state == "straggler" and f.facts.excess_ms < 0, f
    assert f.cause == "compute", f


@pytest.mark.parametrize("wait_ms, cause", [(1.5, "compute"), (4.5, "host_contention")])
def test_a_steady_straggler_keeps_one_cause_through_its_reports_noise(wait_ms, cause):
    # 8 ranks, forward and backward 100 ms +- 2 ms; from the 21st report rank 1 computes 5 ms
    # more in forward and waits wait_ms more for a CPU every step: 30 % or 90 % of its
    # excess, while one report's excess swings by +-3 ms across the 50 % line. One reading of
    # the cause for an unchanging slowdown (the cause read each report changed 20-36 times in
    # 90 reports at 30 %), not one per report's noise.
    for seed in range(3):
        rng = np.random.default_rng(seed)
        verdict = ConfirmedVerdict()
        causes = []
        for k in range(120):
            ms = 100 + rng.normal(0, 2.0, size=(8, 2))
            rq = np.abs(rng.normal(0, 0.2, size=8))
            if k >= 20:
                ms[1, 0] += 5.0
                rq[1] += wait_ms
            result = verdict.update(10 * k, ms, ("forward", "backward"), run_queue_ms=rq)
            causes += [f.cause for f in result.findings if (f.rank, f.stage, f.state) == (1, "forward", "straggler")]
        assert len(causes) >= 80, (seed, len(causes))
        changes = sum(a != b for a, b in zip(causes, causes[1:]))
        assert changes <= 2 and causes[-1] == cause, (seed, changes, causes)


def test_without_run_queue_waits_the_causes_and_facts_are_as_before():
    rng = np.random.default_rng(3)
    verdict = ConfirmedVerdict()
    for k in range(10):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        ms[1, 0] += 12.0 if k >= 3 else 0.0
        result = verdict.update(k, ms, STAGES)
    (f,) = [f for f in result.findings if f.state == "straggler"]
    assert f.cause == "compute" and math.isnan(f.facts.run_queue_ms) and math.isnan(f.facts.run_queue_excess_ms)


def test_run_queue_waits_of_the_wrong_length_are_refused():
    with pytest.raises(ValueError, match=r"run_queue_ms has shape \(3,\), expected \(4,\)"):
        ConfirmedVerdict().update(0, np.full((4, 1), 50.0), STAGES, run_queue_ms=[1.0, 2.0, 3.0])

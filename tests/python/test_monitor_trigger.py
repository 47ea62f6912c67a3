"""The monitor's per-job detector (relax_straggler/monitor/trigger.py) on synthetic
iteration sequences with an injected clock."""

from __future__ import annotations

import pytest

from relax_straggler.stores.base import IterationTime
from relax_straggler.monitor.trigger import (ACTIVE, DETECTED, HANGING, PREDICTING, SLOWDOWN, JobDetector,
                                             TriggerConfig, IterationRange)

CFG = TriggerConfig(history_size=5, slowdown_threshold=0.25, hang_threshold_s=60.0)


def its(steps, first=0):
    return [IterationTime(first + i, float(ms), 0.0, 8) for i, ms in enumerate(steps)]


def feed(det, steps, first, now=0.0):
    """Feeds one iteration at a time; returns (statuses after each, windows triggered)."""
    statuses, windows = [], []
    for i, ms in enumerate(steps):
        w = det.observe(its([ms], first + i), now)
        if w is not None:
            windows.append(w)
        statuses.append(det.status(now))
    return statuses, windows


def test_steady_job_stays_active():
    det = JobDetector(CFG, registered_at=0.0)
    statuses, windows = feed(det, [100, 102, 98, 101, 99, 100, 103, 97] * 5, 0)
    assert set(statuses) == {ACTIVE} and windows == []
    assert det.median_ms == pytest.approx(100, abs=3)


def test_five_slow_iterations_trigger_exactly_that_window():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 40, 0)
    statuses, windows = feed(det, [140] * 5, 40)
    assert statuses == [SLOWDOWN] * 4 + [PREDICTING]
    assert windows == [IterationRange(40, 44)]
    assert det.slow_iterations == 5
    statuses, windows = feed(det, [140] * 7, 45)  # still slow while predicting: no second window
    assert windows == [] and set(statuses) == {PREDICTING}
    det.analysis_finished()
    assert det.status(0.0) == DETECTED


def test_growth_at_the_threshold_is_not_slow():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 10, 0)
    statuses, windows = feed(det, [125] * 10, 10)  # growth exactly 0.25: not > 0.25
    assert set(statuses) == {ACTIVE} and windows == []
    statuses, windows = feed(det, [126] * 5, 20)
    assert windows == [IterationRange(20, 24)]


def test_a_normal_iteration_breaks_the_streak():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 10, 0)
    statuses, windows = feed(det, [150, 150, 150, 150, 100, 150, 150, 150, 150], 10)
    assert windows == []
    assert statuses[3] == SLOWDOWN and statuses[4] == ACTIVE and statuses[-1] == SLOWDOWN


def test_slow_iterations_never_enter_the_baseline():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 5, 0)
    feed(det, [109, 200, 300, 111, 400], 5)  # 109 joins (<= 1.1 x 100); 111 does not (> 1.1 x median 100)
    assert sorted(det.baseline) == [100, 100, 100, 100, 109]


def test_baseline_follows_a_faster_job():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [500, 100, 100, 100, 100, 100, 100], 0)  # a slow first (warm-up) iteration
    assert det.median_ms == 100
    _, windows = feed(det, [100] * 5, 7)
    assert windows == []


def test_no_judgement_before_the_baseline_is_full():
    det = JobDetector(CFG, registered_at=0.0)
    statuses, windows = feed(det, [100, 100, 100, 300, 300, 300, 300], 0)
    assert statuses[:4] == [ACTIVE] * 4  # baseline of 3: 300 is neither slow nor normal
    assert windows == []


def test_detected_returns_to_active_after_history_size_normal_iterations():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 10, 0)
    _, windows = feed(det, [200] * 5, 10)
    assert windows == [IterationRange(10, 14)]
    det.analysis_finished()
    statuses, windows = feed(det, [200] * 10, 15)  # the slowdown goes on: answered already
    assert set(statuses) == {DETECTED} and windows == []
    statuses, _ = feed(det, [100] * 5, 25)
    assert statuses == [DETECTED] * 4 + [ACTIVE]
    _, windows = feed(det, [200] * 5, 30)  # a new slowdown: a new analysis
    assert windows == [IterationRange(30, 34)]


def test_failed_analysis_needs_a_new_streak():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 10, 0)
    feed(det, [200] * 5, 10)
    det.analysis_failed()
    assert det.status(0.0) == ACTIVE
    statuses, windows = feed(det, [200] * 5, 15)
    assert statuses[0] == SLOWDOWN and windows == [IterationRange(15, 19)]


def test_hang_after_the_threshold_and_back_on_progress():
    det = JobDetector(CFG, registered_at=1000.0)
    assert det.status(1059.0) == ACTIVE
    assert det.status(1061.0) == HANGING  # never wrote since registration
    det.observe(its([100]), now=1070.0)
    assert det.status(1100.0) == ACTIVE
    assert det.status(1130.0) == ACTIVE
    assert det.status(1130.5) == HANGING
    det.observe(its([100], first=1), now=1131.0)
    assert det.status(1131.0) == ACTIVE
    det.observe(its([100], first=1), now=1300.0)  # an iteration seen before is no progress
    assert det.status(1300.0) == HANGING


def test_predicting_outranks_hanging_and_hanging_outranks_detected():
    det = JobDetector(CFG, registered_at=0.0)
    feed(det, [100] * 5 + [200] * 5, 0, now=0.0)
    assert det.status(1000.0) == PREDICTING
    det.analysis_finished()
    assert det.status(1000.0) == HANGING
    assert det.status(10.0) == DETECTED


def test_batch_of_iterations_in_one_poll():
    det = JobDetector(CFG, registered_at=0.0)
    window = det.observe(its([100] * 40 + [150] * 5 + [100] * 3), now=5.0)
    assert window == IterationRange(40, 44)
    assert det.status(5.0) == PREDICTING
    assert det.iteration_count == 48 and det.last_iteration == 47


def test_metrics_and_snapshot_round_trip():
    det = JobDetector(CFG, registered_at=3.0)
    assert det.metrics()["avg_iteration_duration"] is None
    feed(det, [100, 110, 90, 100, 100, 200, 200], 0, now=7.0)
    m = det.metrics()
    assert m == {"avg_iteration_duration": pytest.approx(900 / 7), "max_iteration_duration": 200,
                 "min_iteration_duration": 90, "last_iteration_duration": 200}
    copy = JobDetector.from_dict(CFG, det.to_dict())
    assert copy.to_dict() == det.to_dict()
    for d in (det, copy):
        _, windows = feed(d, [200] * 3, 7)
    assert det.to_dict() == copy.to_dict() and det.predicting and copy.predicting


@pytest.mark.parametrize("field, value", [("history_size", 0), ("slowdown_threshold", 0.0),
                                          ("hang_threshold_s", -1.0), ("baseline_tolerance", 0.9)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TriggerConfig(**{field: value})

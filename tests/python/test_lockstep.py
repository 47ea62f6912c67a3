"""The metrics rank's decisions (relax_straggler.live.lockstep): what travels, when it applies, and
that a hold skips samples without ever holding a training step."""

from __future__ import annotations

import threading
import time

import pytest

from relax_straggler.common.side_failure import DECISION_LATE, GATHER_FAILED, GATHER_STUCK, SideFailure
from relax_straggler.live.control import ControlCommand
from relax_straggler.live.lockstep import MIN_LAG_STEPS, Decision, LocalLockstep, decode, depth_for, encode
import relax_straggler
from test_install import config, make, train
from workers.step_times import StepClock, assert_not_blocked


@pytest.mark.parametrize("decision", [
    Decision(),
    Decision(ControlCommand(enabled=False), hold=True),
    Decision(ControlCommand(interval=7, relative_threshold=1.5, absolute_ms_threshold=0.0)),
    Decision(stop=SideFailure(rank=1023, code=GATHER_STUCK, step=123456)),
    Decision(hold=True, stack_rank=8191),
])
def test_a_decision_travels_whole(decision):
    assert decode(encode(42, decision)) == decision


def test_the_detail_of_a_failure_stays_with_the_rank_that_saw_it():
    failure = SideFailure(3, GATHER_FAILED, 12, "Connection reset by peer")
    travelled = decode(encode(1, Decision(stop=failure))).stop
    assert travelled.same(failure) and travelled.detail == ""
    assert failure.describe() == "rank 3's side-group gather of step 12 failed (Connection reset by peer)"
    assert SideFailure(2, DECISION_LATE, 40).describe().startswith(
        "the metrics rank's decision due at step 40 never reached rank 2 (")
    with pytest.raises(ValueError, match="unknown side-group failure code 9"):
        SideFailure(0, 9, 0)


@pytest.mark.parametrize("every, depth", [(1, MIN_LAG_STEPS), (5, 4), (16, 1), (50, 1)])
def test_a_decision_is_read_at_least_min_lag_steps_after_it_was_sent(every, depth):
    assert depth_for(every) == depth and depth * every >= MIN_LAG_STEPS


def test_a_single_process_applies_each_decision_depth_periods_after_it_was_taken():
    lockstep = LocalLockstep(None, every=8)  # depth 2
    taken = iter(range(100))
    applied = {}
    for step in range(50):
        decision = lockstep.at_step(step, lambda: (next(taken) % 2 == 1, None), grace_s=0.0)
        if decision is not None:
            applied[step] = decision.hold
    # Decisions taken at steps 0, 8, 16, ... (hold = odd decision number) apply at 16, 24, ...
    assert applied == {16: False, 24: True, 32: False, 40: True, 48: False}


def test_a_report_thread_far_behind_holds_sampling_and_never_a_training_step(tmp_path):
    release = threading.Event()
    delivered: list[int] = []

    def report_fn(metrics: dict, step: int) -> None:
        if not release.is_set():
            release.wait(60)  # the report thread is stuck in a sink
        delivered.append(step)

    model, opt = make()
    analyzer = relax_straggler.install(model, opt, config=config(queue_size=32, control_every=4),
                                       report_fn=report_fn)
    clock = StepClock()
    try:
        for _ in range(60):
            with clock:
                train(model, opt, analyzer, 1)
        held = analyzer.counters()["skipped_samples"]
        release.set()
        for _ in range(60):
            with clock:
                train(model, opt, analyzer, 1)
    finally:
        release.set()
    counters = analyzer.counters()
    analyzer.uninstall()
    # The queue (32) was half full at the decision of step 16: from the step after its
    # reading (32) samples were held (33 to 60, the step begun when counted), none dropped,
    # and they resumed once the thread caught up.
    assert held == 60 - 32, counters
    assert counters["skipped_samples"] < 60 - 33 + 2 * 16 + 4, counters
    assert counters["dropped_reports"] == 0, counters
    assert delivered[-1] == 119 and delivered == sorted(delivered), delivered
    assert_not_blocked({0: clock.times}, warmup=1)

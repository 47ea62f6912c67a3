"""The sampled stage timer: docs/ARCHITECTURE.md invariants 2 and 3 (events only on sampled steps, a bounded
reused pool, exactly one read point per sampled step and none otherwise)."""

import math
import time

import pytest

from relax_straggler._ext import ext

C = ext()


def test_only_sampled_steps_record_and_read():
    t = C.StageTimer(3, interval=4, warmup_steps=0)
    for step in range(12):
        sampled = t.begin_step(step)
        assert sampled == (step % 4 == 0)
        for _ in range(5):
            with t.section(0):
                pass
        sample = t.end_step()
        assert sample.sampled == sampled
    # Steps 0, 4, 8 sampled: 5 sections x 2 events each, one read point each.
    assert t.events_recorded == 3 * 5 * 2
    assert t.read_points == 3


def test_warmup_steps_are_not_sampled():
    t = C.StageTimer(1, interval=1, warmup_steps=3)
    assert [t.begin_step(s) for s in range(5)] == [False, False, False, True, True]


def test_sections_accumulate_and_nest():
    t = C.StageTimer(2, interval=1)
    t.begin_step(0)
    for _ in range(3):  # three microbatches
        with t.section(0):
            with t.section(0):  # re-entry: counted once, by the outermost pair
                time.sleep(0.002)
            with t.section(1):
                time.sleep(0.001)
    s = t.end_step()
    assert s.calls == [3, 3]
    assert s.device_ms[0] >= 6.0 * 0.95 + 3.0 * 0.95
    assert s.device_ms[1] >= 3.0 * 0.95
    assert s.device_ms[0] > s.device_ms[1]
    assert s.host_ms[0] == pytest.approx(s.device_ms[0], rel=0.05)


def test_stage_not_run_is_nan():
    t = C.StageTimer(2, interval=1)
    t.begin_step(0)
    with t.section(1):
        pass
    s = t.end_step()
    assert math.isnan(s.device_ms[0]) and s.calls[0] == 0


def test_bounded_pool_drops_and_counts():
    t = C.StageTimer(2, interval=1, max_events=6)
    t.begin_step(0)
    for _ in range(5):
        with t.section(0):
            pass
    s = t.end_step()
    # 6 slots hold 3 sections; the 2 others are lost, counted, and the stage has no total.
    assert t.dropped_sections == 2
    assert math.isnan(s.device_ms[0])
    # The pool is reused: the next sampled step has all its slots again.
    t.begin_step(1)
    with t.section(1):
        pass
    assert t.end_step().calls[1] == 1
    assert t.dropped_sections == 2


def test_nested_other_stages_never_overrun_the_pool():
    t = C.StageTimer(4, interval=1, max_events=4)
    t.begin_step(0)
    for stage in range(4):  # four open sections need 8 slots
        t.start(stage)
    for stage in reversed(range(4)):
        t.stop(stage)
    s = t.end_step()
    assert s.calls == [1, 1, 0, 0]
    assert t.dropped_sections == 2


def test_unmatched_and_open_sections_are_counted():
    t = C.StageTimer(2, interval=1)
    t.begin_step(0)
    t.stop(0)
    t.start(1)
    s = t.end_step()
    assert t.unmatched_stops == 1
    assert t.open_at_step_end == 1
    assert math.isnan(s.device_ms[1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="interval"):
        C.StageTimer(2, interval=0)
    with pytest.raises(IndexError):
        C.StageTimer(2, interval=1).section(2)


@pytest.mark.skipif(C.with_cuda, reason="a CUDA build accepts use_cuda=True")
def test_cuda_events_need_a_cuda_build():
    with pytest.raises(ValueError, match="CUDA"):
        C.StageTimer(2, interval=1, use_cuda=True)

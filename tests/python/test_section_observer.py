"""The stage timer's section observer (csrc/cupti/section_observer.h): called at each begin and
end of a section the timer times, on sampled steps only, and never otherwise; fed through a
capsule from relax_straggler._core.kernels (here the test observer SectionRecorder, whose
correlation ids come from a counter) and turned into correlation-id ranges that attribute
activity records to the timer's sections (docs/DESIGN.md, "Kernel records")."""

import ctypes
import gc
import math
import time
import weakref

import pytest

from relax_straggler._ext import core, ext

C = ext()
K = core().kernels
FORWARD, BACKWARD, ATTENTION = 0, 1, 2
MS = 1_000_000  # ns


def observed_timer(interval=1, max_events=4096):
    timer = C.StageTimer(3, interval=interval, warmup_steps=0, max_events=max_events)
    recorder = K.SectionRecorder()
    timer.set_section_observer(recorder.observer())
    return timer, recorder


def run_step(timer, step, microbatches=2):
    """Forward (entered twice, nested: timed once) holding attention, then backward, per microbatch."""
    sampled = timer.begin_step(step)
    for _ in range(microbatches):
        with timer.section(FORWARD):
            with timer.section(FORWARD):
                with timer.section(ATTENTION):
                    pass
        with timer.section(BACKWARD):
            pass
    timer.end_step()
    return sampled


def test_called_on_sampled_steps_only_with_matched_pairs_of_the_timed_sections():
    timer, recorder = observed_timer(interval=3)
    per_step = [(FORWARD, True), (ATTENTION, True), (ATTENTION, False), (FORWARD, False),
                (BACKWARD, True), (BACKWARD, False)] * 2
    for step in range(9):
        before = recorder.calls
        recorder.clear()
        sampled = run_step(timer, step)
        assert sampled == (step % 3 == 0)
        if sampled:
            assert [(stage, begin) for stage, begin, _ in recorder.marks] == per_step
            assert recorder.calls - before == len(per_step)
            assert [stage for stage, _, _, _ in recorder.sections(timer.last_sections)] == \
                [ATTENTION, FORWARD, BACKWARD] * 2
            assert recorder.unmatched == 0
        else:
            assert recorder.calls == before  # never called on an unsampled step
            assert recorder.marks == []
    assert recorder.calls == 3 * len(per_step)


def test_a_section_lost_to_a_full_pool_and_an_unmatched_stop_are_not_observed():
    timer, recorder = observed_timer(max_events=4)  # two sections' events
    timer.begin_step(0)
    for stage in (FORWARD, BACKWARD, ATTENTION):
        with timer.section(stage):
            pass
    timer.stop(FORWARD)  # no section open
    timer.end_step()
    assert timer.dropped_sections == 1 and timer.unmatched_stops == 1
    assert [(stage, begin) for stage, begin, _ in recorder.marks] == \
        [(FORWARD, True), (FORWARD, False), (BACKWARD, True), (BACKWARD, False)]
    assert [stage for stage, _ in timer.last_sections] == [FORWARD, BACKWARD]


def test_cleared_or_never_set_nothing_is_called():
    timer = C.StageTimer(3, interval=1)
    assert not timer.has_section_observer
    run_step(timer, 0)  # no observer: the sections are timed as ever
    assert [stage for stage, _ in timer.last_sections] == [ATTENTION, FORWARD, BACKWARD] * 2
    recorder = K.SectionRecorder()
    timer.set_section_observer(recorder.observer())
    assert timer.has_section_observer
    timer.clear_section_observer()
    assert not timer.has_section_observer
    run_step(timer, 1)
    assert recorder.calls == 0


def test_anything_but_an_observer_capsule_is_refused():
    timer = C.StageTimer(3, interval=1)
    with pytest.raises(TypeError, match="relax_straggler.section_observer"):
        timer.set_section_observer(object())
    new_capsule = ctypes.pythonapi.PyCapsule_New
    new_capsule.restype = ctypes.py_object
    new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    name = ctypes.create_string_buffer(b"some.other.capsule")
    with pytest.raises(TypeError, match="relax_straggler.section_observer"):
        timer.set_section_observer(new_capsule(ctypes.addressof(name), name, None))
    assert not timer.has_section_observer


def test_the_timer_keeps_its_observer_alive():
    timer = C.StageTimer(3, interval=1)
    recorder = K.SectionRecorder()
    alive = weakref.ref(recorder)
    timer.set_section_observer(recorder.observer())
    del recorder
    gc.collect()
    assert alive() is not None  # held through the capsule the timer references
    run_step(timer, 0)
    assert alive().calls == 12
    del timer
    gc.collect()
    assert alive() is None


def test_id_ranges_attribute_records_to_the_timers_sections_and_its_times_give_idle():
    """Records carry the ids the recorder issued while their section was open; a kernel
    launched in forward that ran after backward began stays forward's."""
    timer, recorder = observed_timer()
    stats = K.KernelStats(64)
    t0 = 1_000 * MS
    timer.begin_step(0)
    recorder.clear()
    with timer.section(FORWARD):
        stats.add("kernel", t0, t0 + 2 * MS, 7, "gemm", recorder.issue())
        stats.add("kernel", t0 + 30 * MS, t0 + 33 * MS, 7, "late", recorder.issue())  # ran during backward
        time.sleep(0.020)
    recorder.issue()  # a call between the sections (an event record): in neither
    with timer.section(BACKWARD):
        stats.add("kernel", t0 + 25 * MS, t0 + 29 * MS, 7, "bwd", recorder.issue())
        stats.add("memcpy", t0 + 29 * MS, t0 + 30 * MS, 7, None, recorder.issue())
        time.sleep(0.010)
    stats.add("kernel", t0 + 50 * MS, t0 + 51 * MS, 7, "after", recorder.issue() + 5)
    timer.end_step()
    timed = timer.last_sections
    assert [stage for stage, _ in timed] == [FORWARD, BACKWARD]
    step = stats.summarize_ids(recorder.sections(timed), 5)
    forward, backward = step.sections
    assert forward.kernels == 2 and backward.kernels == 1
    assert forward.busy_ms == pytest.approx(5.0)
    assert forward.span_ms == pytest.approx(33.0)
    assert forward.length_ms == timed[0][1] >= 20.0 * 0.95
    assert forward.idle_ms == pytest.approx(timed[0][1] - 5.0)
    assert backward.copy_ms == pytest.approx(1.0)
    assert backward.idle_ms == pytest.approx(max(0.0, timed[1][1] - 5.0))
    assert step.unattributed_records == 1


def test_without_the_timers_times_idle_is_the_gaps_of_the_span():
    stats = K.KernelStats(8)
    stats.add("kernel", 10 * MS, 12 * MS, 0, "a", 3)
    stats.add("kernel", 15 * MS, 16 * MS, 0, "a", 4)
    (sec,) = stats.summarize_ids([(FORWARD, 2, 4, math.nan)]).sections
    assert sec.idle_ms == pytest.approx(3.0) and sec.length_ms == pytest.approx(6.0)
    with pytest.raises(ValueError, match="device_ms"):
        stats.summarize_ids([(FORWARD, 2, 4, -1.0)])

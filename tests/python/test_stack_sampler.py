"""The Python stack of a confirmed rank: sampled off the training thread, carried in its row
once, and in the facts of its straggler findings."""

import math
import threading
import time

import numpy as np
import pytest

from relax_straggler.common.payload import pack, unpack
from relax_straggler.common.stacks import STACK_LEN, TOP, StackFrame, StackSample, decode, encode
from relax_straggler.common.stages import STAGES
from relax_straggler.judge.confirm import ConfirmedVerdict
from relax_straggler.judge.report import _stacks
from relax_straggler.live.stack_sampler import STEPS, StackSampler


def spin_outside_sections(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_sample_travels_whole_and_an_empty_segment_is_none():
    sample = StackSample(12, (StackFrame("train.py", 42, "spin_outside_sections", 9),
                              StackFrame("model.py", 7, "forward", 2), StackFrame("train.py", 50, "main", 1)))
    assert decode(encode(sample)) == sample
    assert decode(np.full(STACK_LEN, np.nan)) is None
    assert sample.describe().startswith("train.py:42 spin_outside_sections in 9 of 12 samples; model.py:7")
    long = StackSample(3, tuple(StackFrame("f" * 80 + ".py", i, "g", 1) for i in range(TOP)))
    assert len(decode(encode(long)).frames) == 2  # a frame that does not fit whole is left out
    with pytest.raises(ValueError, match="not whole 6-byte words"):
        decode(np.r_[1.0, np.ones(TOP), np.full(STACK_LEN - 1 - TOP, 0.5)])


def test_the_sampler_names_the_function_the_training_thread_spins_in_from_another_thread():
    sampler = StackSampler()
    out = {}

    def training():
        for _ in range(STEPS + 1):
            sampler.step_began(0.04)
            spin_outside_sections(0.04)
            out.setdefault("segment", None)
            segment = sampler.take()
            if segment is not None:
                out["segment"] = segment
        time.sleep(0.05)  # the last step's samples
        out["segment"] = out["segment"] if out["segment"] is not None else sampler.take()

    sampler.arm()
    assert sampler.armed
    t = threading.Thread(target=training)
    t.start()
    t.join()
    sampler.close()
    sample = decode(out["segment"])
    assert sample is not None and sample.samples >= 8, sample
    top = sample.frames[0]
    assert (top.file, top.function) == ("test_stack_sampler.py", "spin_outside_sections"), sample
    assert top.count >= 0.75 * sample.samples
    assert not sampler.armed and sampler.take() is None  # one segment per request


def test_an_unarmed_sampler_starts_no_thread_and_takes_nothing():
    sampler = StackSampler()
    sampler.step_began(0.01)
    assert sampler._thread is None and sampler.take() is None


def test_the_segment_rides_the_row_and_reaches_the_report():
    n = len(STAGES)
    sample = StackSample(4, (StackFrame("train.py", 3, "work", 4),))
    rows = np.stack([pack(10, math.nan, r, np.ones(n), np.ones(n), np.zeros(n), np.ones(n),
                          stack=encode(sample) if r == 1 else None) for r in range(3)])
    g = unpack(rows)
    assert _stacks(g, np.zeros(3, dtype=bool)) == {1: sample}
    assert _stacks(g, np.array([False, True, False])) == {}  # a row not judged
    with pytest.raises(ValueError, match="stack must have shape"):
        pack(10, math.nan, 0, np.ones(n), np.ones(n), np.zeros(n), np.ones(n), stack=np.ones(3))


def test_the_stack_is_in_the_facts_of_the_rank_while_it_is_confirmed_and_then_forgotten():
    rng = np.random.default_rng(3)
    sample = StackSample(12, (StackFrame("train.py", 42, "spin_outside_sections", 9),))
    verdict = ConfirmedVerdict()
    for k in range(16):
        ms = 50.0 * (1 + 0.01 * rng.standard_normal((4, 1)))
        if 3 <= k < 10:
            ms[1, 0] += 20.0
        result = verdict.update(k, ms, ("forward",), stacks={1: sample} if k == 6 else None)
        named = [f for f in result.findings if f.rank == 1 and f.state == "straggler"]
        if 6 <= k < 10:
            assert named and named[0].facts.stack == sample, k
            assert named[0].describe().endswith(
                "its training thread was in train.py:42 spin_outside_sections in 9 of 12 samples; cause: compute")
        elif k < 6:
            assert all(f.facts.stack is None for f in named)
    assert all(f.facts.stack is None for f in result.findings)  # released: forgotten


@pytest.mark.parametrize("interval", [2, 3, 1])
def test_the_stack_is_sampled_on_steps_the_timer_does_not_time(interval):
    # A sample holds the interpreter lock, and on a crowded host waits for a CPU while it
    # does: the step it falls in runs longer. The steps the verdict judges are never those
    # (but at interval 1, where every step is timed).
    from relax_straggler import StragglerConfig
    import relax_straggler

    config = StragglerConfig(enabled=True, console=False, interval=interval, warmup_steps=0)
    analyzer = relax_straggler.install(None, None, config=config)
    began = []
    try:
        analyzer._stacks.arm()  # what the metrics rank's decision naming this rank does
        analyzer._stacks.step_began = lambda span_s: began.append(analyzer._step)
        for _ in range(4 * interval):
            analyzer.step()
    finally:
        analyzer.uninstall()
    assert began, "the armed sampler was never started"
    if interval > 1:
        assert [s for s in began if s % interval == 0] == [], began

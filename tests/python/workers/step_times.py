"""The step-time guard of every multi-rank test: observing never blocks training.

A worker times each of its training steps with a StepClock and hands the times back with
its result; the test passes every rank's times to `assert_not_blocked`, which fails when a
step with the analyzer took longer than the slowest step of the run's warm-up plus
FACTOR x the run's median step on that rank (at least MIN_MARGIN_S more). The bound is
generous on purpose: a loaded host slows steps by a few times, and a virtual machine whose
CPUs the hypervisor takes away (here about a tenth of their time even when idle, /proc/stat
"steal") freezes every rank for up to a second (steps of 13 ms median took 230-900 ms in
the fault suite on a quiet host); a wait on a peer or on the metrics rank (seconds to
minutes) exceeds it by far. Shorter stalls of our own are for tests that measure them
(tests/python/test_report_imports.py).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Mapping, Sequence

FACTOR = 10.0  # median steps a step may exceed the warm-up's slowest by
MIN_MARGIN_S = 1.0  # ... and at least this (a host freeze, short steps)


class StepClock:
    """Wall time of each step on this rank, in seconds: `with clock:` around one step, or
    lap() at the end of each step (the first lap counts from the clock's creation or the
    last start())."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._began = time.perf_counter()

    def start(self) -> None:
        self._began = time.perf_counter()

    def lap(self) -> None:
        now = time.perf_counter()
        self.times.append(now - self._began)
        self._began = now

    def __enter__(self) -> "StepClock":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.lap()


def bound_s(times: Sequence[float], warmup: int) -> float:
    """The longest a step after the first `warmup` steps (at least 1) may take: the slowest
    warm-up step plus FACTOR x the median step, at least MIN_MARGIN_S."""
    warm = max(warmup, 1)
    return max(times[:warm]) + max(FACTOR * statistics.median(times), MIN_MARGIN_S)


def blocked_steps(times: Sequence[float], warmup: int) -> list[tuple[int, float]]:
    """(step, seconds) of every step after the warm-up longer than bound_s."""
    if len(times) <= max(warmup, 1):
        return []
    limit = bound_s(times, warmup)
    return [(i, t) for i, t in enumerate(times) if i >= max(warmup, 1) and t > limit]


def assert_not_blocked(times_by_rank: Mapping[Any, Sequence[float]], warmup: int, *,
                       steps: slice = slice(None), expected_steps: int | None = None) -> None:
    """Fails naming the rank, step and times when any rank has a blocked step (see
    blocked_steps). steps: the part of each rank's steps to judge (for instance before a
    fault the test injects into training itself); expected_steps: how many steps each rank
    must have timed (a worker that stopped timing guards nothing)."""
    assert times_by_rank, "no step times were recorded"
    problems = []
    for rank, times in times_by_rank.items():
        if expected_steps is not None:
            assert len(times) == expected_steps, f"rank {rank} timed {len(times)} steps, expected {expected_steps}"
        judged = list(times)[steps]
        for step, took in blocked_steps(judged, warmup):
            problems.append(f"rank {rank} step {step}: {took * 1e3:.0f} ms > {bound_s(judged, warmup) * 1e3:.0f} ms "
                            f"(median {statistics.median(judged) * 1e3:.1f} ms)")
    assert not problems, "training steps blocked: " + "; ".join(problems)

"""The per-job slow-iteration and hang detector of the monitor: pure, no I/O, the clock is
passed in (`now`, s), so every transition is testable without sleeping.

Per new iteration (step_ms = interval-time, the slowest rank's):

- baseline: the last `history_size` *normal* iterations. An iteration joins it only when
  step_ms <= baseline_tolerance (1.1) x the current median (any iteration joins an empty
  baseline), so slow iterations never drag the reference up.
- slow: once the baseline is full, growth = step_ms / median - 1 > slowdown_threshold (0.25).
- trigger: `history_size` consecutive slow iterations -> an IterationRange [first, last] of exactly
  those iterations, for the analysis (the monitor bounds it by the registration time).
- hang: no new iteration for more than hang_threshold_s (60 s) since the last one arrived
  (or since registration when none has). After a restart of the monitor, iterations up to
  the newest one seen before it (`seen_before`, kept with when it arrived) are read again
  from the store: they are folded in as usual, but they are not new progress.

- finished: the job wrote its end-of-run row (relax_straggler.stores.end_rows) at or after
  its last iteration: it ended normally, and no wait for a next iteration is a hang. A new
  iteration after that step (a job id run again) makes it unfinished.

Status, first match wins:

    predicting  an analysis of a triggered window is running
    finished    the job ended normally (its end-of-run row is in the store)
    hanging     no new iteration for more than hang_threshold_s
    detected    an analysis finished; stays until `history_size` consecutive iterations are
                not slow, then back to active (while detected, slow iterations trigger no
                new analysis: the running slowdown has its answer)
    slowdown    1 .. history_size - 1 consecutive slow iterations
    active      otherwise (also before the first iteration)

A failed analysis (store error, unusable rows) returns to slowdown/active with the streak
cleared: `history_size` new slow iterations trigger again.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional, Sequence

from relax_straggler.stores.base import IterationTime

ACTIVE, SLOWDOWN, HANGING, PREDICTING, DETECTED, FINISHED = (
    "active", "slowdown", "hanging", "predicting", "detected", "finished")
STATUSES: tuple[str, ...] = (ACTIVE, SLOWDOWN, HANGING, PREDICTING, DETECTED, FINISHED)


@dataclass(frozen=True)
class TriggerConfig:
    """history_size: baseline length and slow streak that triggers (iterations);
    slowdown_threshold: growth over the median that makes an iteration slow (0.25 = +25 %);
    hang_threshold_s: s without a new iteration before hanging; baseline_tolerance: an
    iteration joins the baseline when step_ms <= this x the median."""

    history_size: int = 5
    slowdown_threshold: float = 0.25
    hang_threshold_s: float = 60.0
    baseline_tolerance: float = 1.1

    def __post_init__(self) -> None:
        if self.history_size < 1:
            raise ValueError(f"history_size must be >= 1, got {self.history_size}")
        if not self.slowdown_threshold > 0:
            raise ValueError(f"slowdown_threshold must be > 0, got {self.slowdown_threshold}")
        if not self.hang_threshold_s > 0:
            raise ValueError(f"hang_threshold_s must be > 0 s, got {self.hang_threshold_s}")
        if not self.baseline_tolerance >= 1:
            raise ValueError(f"baseline_tolerance must be >= 1, got {self.baseline_tolerance}")


@dataclass(frozen=True)
class IterationRange:
    """Iterations [first_iteration, last_iteration] to analyse (inclusive)."""

    first_iteration: int
    last_iteration: int


class JobDetector:
    """The state of one job. registered_at: s (the monitor's clock)."""

    def __init__(self, config: TriggerConfig, registered_at: float) -> None:
        self.config = config
        self.registered_at = registered_at
        self.baseline: deque[float] = deque(maxlen=config.history_size)
        self.slow_streak: list[int] = []  # iterations of the current run of slow ones
        self.normal_streak = 0  # consecutive not-slow iterations while detected
        self.predicting = False
        self.detected = False
        self.last_progress = registered_at  # when the newest iteration arrived, s
        self.last_iteration: Optional[int] = None
        # The newest iteration a monitor had seen before a restart, while this one has not
        # folded it in yet; last_progress is when it arrived.
        self.seen_before: Optional[int] = None
        self.last_growth: Optional[float] = None
        self.last_slow = False  # the newest iteration was slow
        self.iteration_count = 0
        self.slow_iterations = 0
        self.sum_ms = 0.0
        self.min_ms = math.inf
        self.max_ms = -math.inf
        self.last_ms: Optional[float] = None
        self.finished_at: Optional[int] = None  # the step of the job's end-of-run row, while it holds

    @property
    def median_ms(self) -> Optional[float]:
        """The baseline's median step time, ms (None before the first iteration)."""
        return statistics.median(self.baseline) if self.baseline else None

    def observe(self, iterations: Sequence[IterationTime], now: float) -> Optional[IterationRange]:
        """Folds in new iterations (ascending; ones at or before the last seen are ignored).
        Returns the window to analyse when this call completes a slow streak (the detector
        is then predicting until analysis_finished / analysis_failed), else None."""
        window = None
        for it in iterations:
            if self.last_iteration is not None and it.iteration <= self.last_iteration:
                continue
            self.last_iteration = it.iteration
            if self.finished_at is not None and it.iteration > self.finished_at:
                self.finished_at = None  # the job runs again
            if self.seen_before is None or it.iteration > self.seen_before:
                self.last_progress, self.seen_before = now, None
            found = self._fold(it)
            window = found or window
        return window

    def _fold(self, it: IterationTime) -> Optional[IterationRange]:
        step, cfg = it.step_ms, self.config
        self.iteration_count += 1
        self.sum_ms += step
        self.min_ms, self.max_ms, self.last_ms = min(self.min_ms, step), max(self.max_ms, step), step
        median = self.median_ms
        if median is None:
            self.baseline.append(step)
            return None
        self.last_growth = step / median - 1.0 if median > 0 else math.inf
        slow = self.last_slow = len(self.baseline) == cfg.history_size and self.last_growth > cfg.slowdown_threshold
        if step <= cfg.baseline_tolerance * median:
            self.baseline.append(step)
        if not slow:
            self.slow_streak.clear()
            if self.detected:
                self.normal_streak += 1
                if self.normal_streak >= cfg.history_size:
                    self.detected, self.normal_streak = False, 0
            return None
        self.slow_iterations += 1
        self.normal_streak = 0
        if self.predicting or self.detected:
            return None
        self.slow_streak.append(it.iteration)
        if len(self.slow_streak) < cfg.history_size:
            return None
        window = IterationRange(self.slow_streak[0], self.slow_streak[-1])
        self.slow_streak.clear()
        self.predicting = True
        return window

    def restore_seen(self, iteration: int, at: float) -> None:
        """After a restart: `iteration` had arrived at `at` (s), after this detector's state
        was saved; the iterations up to it are not new progress when they arrive again."""
        if self.last_iteration is None or iteration > self.last_iteration:
            self.seen_before = iteration
        self.last_progress = max(self.last_progress, at)

    def finish(self, last_step: int) -> None:
        """The job's end-of-run row names `last_step`: finished, unless an iteration after
        it was seen already."""
        if self.last_iteration is None or self.last_iteration <= last_step:
            self.finished_at = last_step

    @property
    def finished(self) -> bool:
        """The job ended normally (finish) and no iteration came after."""
        return self.finished_at is not None

    def analysis_finished(self) -> None:
        """The triggered analysis produced a result: detected."""
        self.predicting, self.detected, self.normal_streak = False, True, 0

    def analysis_failed(self) -> None:
        """The triggered analysis could not run: back to slowdown/active, streak cleared."""
        self.predicting = False
        self.slow_streak.clear()

    def hanging(self, now: float) -> bool:
        """No new iteration for more than hang_threshold_s at `now` (s), and not finished."""
        return not self.finished and now - self.last_progress > self.config.hang_threshold_s

    def status(self, now: float) -> str:
        """One of STATUSES at `now` (see the module docstring for the order)."""
        if self.predicting:
            return PREDICTING
        if self.finished:
            return FINISHED
        if self.hanging(now):
            return HANGING
        if self.detected:
            return DETECTED
        return SLOWDOWN if self.slow_streak else ACTIVE

    def metrics(self) -> dict:
        """Iteration durations seen since registration, ms: avg, max, min, last (None before
        the first iteration)."""
        if not self.iteration_count:
            return {"avg_iteration_duration": None, "max_iteration_duration": None,
                    "min_iteration_duration": None, "last_iteration_duration": None}
        return {"avg_iteration_duration": self.sum_ms / self.iteration_count, "max_iteration_duration": self.max_ms,
                "min_iteration_duration": self.min_ms, "last_iteration_duration": self.last_ms}

    def to_dict(self) -> dict:
        """A JSON-ready snapshot (from_dict restores it; a running analysis is not part of it:
        the monitor keeps its window and runs it again after a restart)."""
        return {"registered_at": self.registered_at, "baseline": list(self.baseline),
                "slow_streak": list(self.slow_streak), "normal_streak": self.normal_streak,
                "detected": self.detected, "last_progress": self.last_progress,
                "last_iteration": self.last_iteration, "seen_before": self.seen_before,
                "last_growth": self.last_growth, "last_slow": self.last_slow,
                "iteration_count": self.iteration_count, "slow_iterations": self.slow_iterations,
                "sum_ms": self.sum_ms, "min_ms": self.min_ms if self.iteration_count else None,
                "max_ms": self.max_ms if self.iteration_count else None, "last_ms": self.last_ms,
                "finished_at": self.finished_at}

    @staticmethod
    def from_dict(config: TriggerConfig, state: dict) -> "JobDetector":
        """The detector of a to_dict() snapshot. Raises KeyError, TypeError, ValueError or
        OverflowError (an infinite count) on a malformed one."""
        d = JobDetector(config, float(state["registered_at"]))
        d.baseline.extend(float(x) for x in state["baseline"])
        d.slow_streak = [int(x) for x in state["slow_streak"]]
        d.normal_streak = int(state["normal_streak"])
        d.detected = bool(state["detected"])
        d.last_progress = float(state["last_progress"])
        d.last_iteration = state["last_iteration"]
        seen = state.get("seen_before")  # absent from states saved before it existed
        d.seen_before = None if seen is None else int(seen)
        d.last_growth = state["last_growth"]
        d.last_slow = bool(state["last_slow"])
        d.iteration_count = int(state["iteration_count"])
        d.slow_iterations = int(state["slow_iterations"])
        d.sum_ms = float(state["sum_ms"])
        if d.iteration_count:
            d.min_ms, d.max_ms = float(state["min_ms"]), float(state["max_ms"])
        d.last_ms = state["last_ms"]
        finished = state.get("finished_at")  # absent from states saved before it existed
        d.finished_at = None if finished is None else int(finished)
        return d

"""The interpreter's garbage-collection pauses, measured on every step.

CPython stops every Python thread of the process while it collects: a rank whose heap keeps
growing (a cache that only grows, long-lived tensors' Python wrappers) pauses in full
collections of 100 ms and more every few tens of steps, and its peers wait for it at the
next collective. Such pauses are rare and long, so they seldom land on a sampled step: the
callback (`gc.callbacks`) accumulates every collection's wall time, by generation, on every
step, and each sampled row carries what accumulated since the previous one.

Cost: two calls of `_on_gc` per collection (a perf_counter_ns read and a few integer
additions, no other allocation); nothing per step. The callback never raises into the
interpreter: a failure is swallowed and the pause is not counted.
"""

from __future__ import annotations

import gc
import math
from time import perf_counter_ns

import numpy as np

from relax_straggler.common.payload import GC_FIELDS

GENERATIONS = 3  # CPython's: 0 and 1 are young, 2 is the full collection


class GcPauses:
    """Collections of this process since install(), cumulative, per generation.

    mark(step) when a sampled step begins and take(step) when it ends return what
    accumulated since the previous take (or install), and within the step, as the row's
    GC_FIELDS. The callback runs on whichever thread collects; the totals only grow, so a
    collection that lands inside take() is counted in the next span, never lost or counted
    twice.
    """

    def __init__(self) -> None:
        self._ns = [0] * GENERATIONS  # pause wall time, ns
        self._count = [0] * GENERATIONS
        self._began = 0  # perf_counter_ns of the collection in progress, 0 when none
        self._installed = False
        self._taken = (0, 0, 0, 0)  # (total ns, collections, full ns, full collections) at the last take
        self._taken_step = -1
        self._marked = (-1, 0)  # (step, total ns) when the sampled step began

    def install(self) -> None:
        """Starts counting (adds the callback to gc.callbacks); a second call does nothing."""
        if not self._installed:
            gc.callbacks.append(self._on_gc)
            self._installed = True

    def remove(self) -> None:
        """Stops counting (removes the callback); safe to call when not installed."""
        if self._installed:
            self._installed = False
            try:
                gc.callbacks.remove(self._on_gc)
            except ValueError:  # someone cleared gc.callbacks: nothing left to remove
                pass

    def _on_gc(self, phase: str, info: dict) -> None:
        try:
            if phase == "start":
                self._began = perf_counter_ns()
            elif self._began:
                g = info["generation"]
                if g >= GENERATIONS:
                    g = GENERATIONS - 1
                self._ns[g] += perf_counter_ns() - self._began
                self._count[g] += 1
                self._began = 0
        except Exception:  # the interpreter's collection must never see an error of ours
            self._began = 0

    def totals(self) -> tuple[int, int, int, int]:
        """(pause ns, collections, full-collection pause ns, full collections) since install."""
        full_ns, full = self._ns[GENERATIONS - 1], self._count[GENERATIONS - 1]
        return sum(self._ns), sum(self._count), full_ns, full

    def mark(self, step: int) -> None:
        """Notes the pause total when sampled step `step` begins."""
        self._marked = (step, sum(self._ns))

    def take(self, step: int) -> np.ndarray:
        """What accumulated since the previous take, as GC_FIELDS (gc_ms, gc_count,
        gc_full_ms, gc_full_count, gc_steps, gc_step_ms): ms, counts, the steps the span
        covers (after the previous take's `step` up to `step`; the first span counts from
        install, step 0) and the pause time since mark(step), NaN when `step` was not marked.
        NaN everywhere when not installed (not measured)."""
        if not self._installed:
            return np.full(len(GC_FIELDS), math.nan)
        now = self.totals()
        before, self._taken = self._taken, now
        steps, self._taken_step = step - self._taken_step, step
        marked_step, marked_ns = self._marked
        in_step = (now[0] - marked_ns) / 1e6 if marked_step == step else math.nan
        return np.array(((now[0] - before[0]) / 1e6, now[1] - before[1], (now[2] - before[2]) / 1e6,
                         now[3] - before[3], steps, in_step), dtype=np.float64)

"""Where a confirmed rank's training thread spends its time: its Python stack, sampled.

When the metrics rank confirms a straggler, its next decision to every rank
(relax_straggler.live.lockstep) names that rank, and that rank arms its StackSampler: in each of
its next STEPS steps that the analyzer does not time (a sample lengthens the step it falls
in; at interval 1, where every step is timed, those) a sampler thread of its own reads the
training thread's current frame SAMPLES times, spread evenly over the step's expected length, through
sys._current_frames(). The training thread is never stopped or called into: the sampler
holds the interpreter lock for one dict of frames and a walk of at most MAX_DEPTH of them
(docs/PERFORMANCE.md, "Stack samples"). A sample counts the innermost frame of the user's
code: outside torch, the standard library and this package (the function that spins, the
forward that sleeps, the line that called backward); the innermost frame of all when every
frame is library code. After STEPS such steps the TOP most frequent (file name, line,
function) travel once in the rank's row (relax_straggler.common.stacks) and the verdict's facts
carry them (relax_straggler.judge.confirm, Facts.stack).

Nothing is imported or allocated on the training thread at sample time; the sampler thread
is started the first time the rank is named (never where no rank is).
"""

from __future__ import annotations

import collections
import os
import sys
import sysconfig
import threading
import time
from typing import Optional

import numpy as np
import torch

from relax_straggler.common.stacks import TOP, StackFrame, StackSample, encode

STEPS = 3  # steps a request covers
SAMPLES = 4  # samples per step
MAX_DEPTH = 64  # frames walked per sample, innermost first

# Library code a sample looks through for the user's frame.
_LIBRARY = tuple(os.path.dirname(p) + os.sep for p in (torch.__file__, __file__)) + tuple(
    {sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")})


def user_frame(frame) -> tuple[str, int, str]:
    """(file name, line, function) of the innermost frame of `frame`'s stack outside library
    code (torch, the standard library, installed packages, this package); of `frame` itself
    when all of the first MAX_DEPTH are library code."""
    f, depth = frame, 0
    while f is not None and depth < MAX_DEPTH:
        code = f.f_code
        if not code.co_filename.startswith(_LIBRARY):
            return os.path.basename(code.co_filename), f.f_lineno, code.co_name
        f, depth = f.f_back, depth + 1
    code = frame.f_code
    return os.path.basename(code.co_filename), frame.f_lineno, code.co_name


class StackSampler:
    """Samples this rank's training thread's stack over the next STEPS steps it is told of
    (step_began) once armed. arm(), step_began() and take() are called by the training thread; the sampling
    runs on a daemon thread of its own."""

    def __init__(self, steps: int = STEPS, samples: int = SAMPLES) -> None:
        self._steps, self._samples = steps, samples
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._left = 0  # steps still to sample
        self._target = 0  # thread ident of the training thread
        self._span_s = 0.0  # expected step length, s
        self._counts: collections.Counter = collections.Counter()
        self._taken = 0
        self._ready: Optional[np.ndarray] = None

    @property
    def armed(self) -> bool:
        return self._left > 0

    def arm(self) -> None:
        """Starts a request: the next STEPS steps told of are sampled (a request under way
        starts over)."""
        with self._lock:
            self._counts.clear()
            self._taken = 0
            self._ready = None
            self._left = self._steps
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="relax_straggler-stack", daemon=True)
            self._thread.start()

    def step_began(self, span_s: float) -> None:
        """A step to sample begins on the calling (training) thread, expected to last span_s s."""
        if self._left > 0:
            self._target, self._span_s = threading.get_ident(), max(span_s, 1e-3)
            self._wake.set()

    def take(self) -> Optional[np.ndarray]:
        """The request's row segment once all its steps were sampled (once), else None."""
        if self._ready is None:
            return None
        with self._lock:
            ready, self._ready = self._ready, None
        return ready

    def close(self) -> None:
        """Stops the sampler thread (it exits at its next wake-up; never waited for)."""
        self._closed = True
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            target, span = self._target, self._span_s
            began = time.perf_counter()
            for k in range(self._samples):
                pause = began + span * (k + 0.5) / self._samples - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                frame = sys._current_frames().get(target)
                if frame is not None:
                    where = user_frame(frame)
                    del frame
                    with self._lock:
                        self._counts[where] += 1
                        self._taken += 1
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    frames = tuple(StackFrame(f, line, fn, n) for (f, line, fn), n in self._counts.most_common(TOP))
                    self._ready = encode(StackSample(self._taken, frames))

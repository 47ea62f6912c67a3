"""The training thread's CPU run-queue wait: host contention, measured.

Linux accounts, per thread, the time it was ready to run but waited for a CPU that another
task held (the second field of /proc/<pid>/task/<tid>/schedstat, ns, the scheduler's
`run_delay`). A step of a rank whose core is shared (other processes, other ranks packed on
too few cores, a throttled cgroup) takes longer in wall time while its own work did not grow:
that wait is where the time went. Sleeping, blocking on I/O, a collective or a CUDA
synchronization is not runnable, so it never counts: a rank slow because it computes more,
or waits for a peer, shows none.

Read on sampled steps only, twice a step (one pread of ~100 bytes, a few us); NaN where the
kernel does not provide it (not Linux, CONFIG_SCHED_INFO off), and from then on nothing is
tried again.
"""

from __future__ import annotations

import math
import os
import threading
from typing import Optional


class RunQueueClock:
    """The run-queue wait of the training thread over a span: start() when a sampled step
    begins, elapsed_ms() when it ends, from the same thread."""

    def __init__(self) -> None:
        self._fd: Optional[int] = None
        self._tid: Optional[int] = None
        self._unavailable = False
        self._started: tuple[Optional[int], float] = (None, math.nan)

    def start(self) -> None:
        """Marks the span's beginning on the calling thread."""
        self._started = (threading.get_native_id(), self.read_ms())

    def elapsed_ms(self) -> float:
        """The calling thread's run-queue wait since start(), ms; NaN when not measured
        (not available, never started, or started on another thread)."""
        tid, began = self._started
        if tid != threading.get_native_id():
            return math.nan
        return self.read_ms() - began

    def read_ms(self) -> float:
        """The calling thread's run-queue wait since it started, ms; NaN when not available."""
        if self._unavailable:
            return math.nan
        tid = threading.get_native_id()
        try:
            if tid != self._tid:
                self.close()
                self._fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
                self._tid = tid
            fields = os.pread(self._fd, 128, 0).split()
            return int(fields[1]) / 1e6
        except (OSError, IndexError, ValueError):
            self.close()
            self._unavailable = True
            return math.nan

    def close(self) -> None:
        """Releases the open account file (read_ms opens it again when called)."""
        if self._fd is not None:
            fd, self._fd, self._tid = self._fd, None, None
            os.close(fd)

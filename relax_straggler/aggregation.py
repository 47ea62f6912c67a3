"""Gathering the per-rank payload to the metrics rank over a side Gloo group.

docs/ARCHITECTURE.md invariant 4: the gather runs on a process group created for us at install (Gloo, CPU
tensors), never on the training groups, and never with a barrier. It is asynchronous:
the training thread only launches it; the metrics rank's report thread waits for it.
Every rank joins every gather of a sampled step, also with an empty (all-NaN) payload,
so the ranks stay in lockstep. The per-op row of the live what-if (payload.pack_ops)
travels appended to the stage row in the same gather.

A rank gone (its gathers fail) or stopped (they never finish) ends the analysis on the
ranks that notice, with one warning each; training goes on. Every wait here is bounded, and
a group left with a collective waiting for a stopped rank is never destroyed (see
_keep_alive), so neither uninstall nor the process exit waits for Gloo's timeout.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import threading
import time
from datetime import timedelta
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.payload import ROW_LEN, PendingRows

log = logging.getLogger(__name__)

# Seconds a rank waits on a gather or broadcast that a peer does not join before it ends the
# analysis on this rank (training goes on). Far above any wait of a live run: ranks in
# lockstep join within a step of each other.
STALL_TIMEOUT_S = 300.0
_POLL_S = 0.05  # how often a waiting report thread checks for shutdown


class GatherUnavailable(RuntimeError):
    """A gather's rows will never come: the side group failed (a rank gone or stopped) or
    shutdown abandoned the wait."""


class _Ready:
    """Rows already here: (ranks, ROW_LEN + per-op row length)."""

    def __init__(self, rows: np.ndarray) -> None:
        self._rows = rows

    def wait(self) -> np.ndarray:
        return self._rows[:, :ROW_LEN]

    def op_rows(self) -> np.ndarray:
        """The per-op rows (ranks, op_row_len) that travelled with the stage rows (after wait())."""
        return self._rows[:, ROW_LEN:]


class _InFlight:
    def __init__(self, work: dist.Work, buffers: list[torch.Tensor], owner: SideGroupGather) -> None:
        self._work = work
        self._buffers = buffers
        self._owner = owner
        self._rows: Optional[np.ndarray] = None

    def _all(self) -> np.ndarray:
        if self._rows is None:
            self._owner.wait_for(self._work)
            self._rows = torch.stack(self._buffers).numpy()
        return self._rows

    def wait(self) -> np.ndarray:
        """The stage rows; raises GatherUnavailable when they will never come."""
        return self._all()[:, :ROW_LEN]

    def op_rows(self) -> np.ndarray:
        """The per-op rows (ranks, op_row_len) that travelled with the stage rows."""
        return self._all()[:, ROW_LEN:]


def _joined(row: np.ndarray, op_row: Optional[np.ndarray]) -> np.ndarray:
    """One float64 vector: the stage row, then the per-op row if any (one gather for both)."""
    parts = [row] if op_row is None else [row, op_row]
    return np.concatenate(parts).astype(np.float64, copy=False)


class LocalGather:
    """Single process (torch.distributed not initialized): the one row is the matrix."""

    rank = 0
    world_size = 1
    is_metrics_rank = True
    stalls = 0
    failed: Optional[str] = None

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None) -> Optional[PendingRows]:
        return _Ready(_joined(row, op_row).reshape(1, -1))

    def abandon(self) -> None:
        pass

    def close(self, timeout_s: float = 5.0, clean: bool = True) -> bool:
        return True


class SideGroupGather:
    """Async gather of one ROW_LEN float64 row per rank to the metrics rank.

    ranks: global ranks analyzed together (the training group's ranks); metrics_rank is
    an index into them. Creating the side group is collective over the default group:
    every process must construct a SideGroupGather at the same point (install does).
    At most `max_pending` gathers stay unfinished on a rank; beyond that a non-metrics rank
    waits for the oldest and counts it in `stalls` (only if the metrics rank falls far
    behind). A failed gather (a rank gone), or one stuck for STALL_TIMEOUT_S (a rank
    stopped), ends the analysis on this rank: `failed` says why, gather() returns None
    from then on and training goes on.
    """

    def __init__(self, ranks: Sequence[int], metrics_rank: int, max_pending: int = 8) -> None:
        if not 0 <= metrics_rank < len(ranks):
            raise ValueError(f"--straggler-metrics-rank {metrics_rank} is not a rank of the analyzed group "
                             f"(size {len(ranks)})")
        self._ranks = list(ranks)
        self.group = dist.new_group(ranks=self._ranks, backend="gloo")
        me = dist.get_rank()
        self.rank = self._ranks.index(me) if me in self._ranks else -1
        self.world_size = len(self._ranks)
        self._dst = self._ranks[metrics_rank]
        self.metrics_global_rank = self._dst  # the global rank of the metrics rank
        self.is_metrics_rank = me == self._dst
        # (launch time, work) of this rank's unfinished gathers, oldest first.
        self._pending: collections.deque[tuple[float, dist.Work]] = collections.deque()
        self._max_pending = max_pending
        self.stall_timeout_s = STALL_TIMEOUT_S
        self.stalls = 0
        self.failed: Optional[str] = None
        self._fail_lock = threading.Lock()
        self._abandoned = threading.Event()

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None) -> Optional[PendingRows]:
        """Launches the gather of the stage row and, appended to it in the same tensor, the
        per-op row (relax_straggler.payload.pack_ops; every rank gives one of the same
        length, or every rank none); returns the rows' handle on the metrics rank, else None
        (also once the analysis ended on this rank, see `failed`)."""
        if self.rank < 0 or self.failed is not None:
            return None  # not in the analyzed group, or the side group is gone
        send = torch.from_numpy(_joined(row, op_row))
        buffers = [torch.empty(len(send), dtype=torch.float64) for _ in range(self.world_size)] if self.is_metrics_rank else None
        work = dist.gather(send, gather_list=buffers, dst=self._dst, group=self.group, async_op=True)
        self._track(work)
        return _InFlight(work, buffers, self) if self.is_metrics_rank else None

    def wait_for(self, work: dist.Work) -> None:
        """Waits for one gather (the metrics rank's report thread). Raises GatherUnavailable
        when it failed, when the side group failed meanwhile, or when abandon() was called."""
        while True:
            done = self._outcome(work, _POLL_S)
            if done is not None:
                break
            if self._abandoned.is_set() or self.failed is not None:
                done = False
                break
        if not done:
            raise GatherUnavailable(self.failed or "abandoned at shutdown")

    def abandon(self) -> None:
        """Releases a report thread waiting in wait_for (shutdown gave up on it)."""
        self._abandoned.set()

    def close(self, timeout_s: float = 5.0, clean: bool = True) -> bool:
        """Waits at most timeout_s s for this rank's unfinished gathers, then releases the
        side group (no wait once the group failed). clean=False: another collective on the
        group (runtime control) may be unfinished. Returns True when the group was
        destroyed; False when an unfinished collective kept it (see _keep_alive)."""
        self._abandoned.set()
        deadline = time.monotonic() + (0.0 if self.failed is not None else timeout_s)
        while clean and self._pending:
            if self._outcome(self._pending[0][1], deadline - time.monotonic()) is None:
                clean = False
                break
            self._pending.popleft()
        self._pending.clear()
        group, self.group = self.group, None
        if group is None or self.rank < 0:
            return True
        if not clean:
            _keep_alive(group)
            log.warning("relax_straggler: a side-group collective still waits for a stopped rank; the group is "
                        "released at process exit instead of being waited for")
        dist.destroy_process_group(group)
        return clean

    def _track(self, work: dist.Work) -> None:
        now = time.monotonic()
        while self._pending and self._pending[0][1].is_completed():
            self._outcome(self._pending.popleft()[1], _POLL_S)  # notes a failure
        self._pending.append((now, work))
        if len(self._pending) <= self._max_pending:
            return
        if self.is_metrics_rank:
            # The metrics rank never waits (its report queue bounds what is judged); its
            # oldest gather unfinished this long means a peer is stopped.
            if now - self._pending[0][0] > self.stall_timeout_s:
                self.fail(f"no gather finished for {self.stall_timeout_s:.0f} s: a rank stopped?")
            return
        self.stalls += 1
        if self.stalls == 1:
            log.warning("relax_straggler: the metrics rank is %d gathers behind; waiting for it", self._max_pending)
        if self._outcome(self._pending[0][1], self.stall_timeout_s) is None:
            self.fail(f"the metrics rank joined no gather for {self.stall_timeout_s:.0f} s: stopped?")
            return
        self._pending.popleft()

    def _outcome(self, work: dist.Work, timeout_s: float) -> Optional[bool]:
        """Waits at most timeout_s s: True when the work succeeded, False when it failed (the
        side group is then marked failed), None when it is still running."""
        try:
            work.wait(timedelta(seconds=max(timeout_s, 0.001)))  # 0 would mean no limit
            return True
        except RuntimeError as exc:
            if not work.is_completed():
                return None  # only our limit passed
            self.fail(reason(exc))
            return False

    def fail(self, why: str) -> None:
        """Ends the analysis on this rank (the side group is unusable: a rank gone or
        stopped); logs once, the first reason wins."""
        with self._fail_lock:
            if self.failed is not None:
                return
            self.failed = why
        log.warning("relax_straggler: the side group failed (%s); the analysis stops on this rank, training "
                    "continues", why)


def reason(exc: BaseException, limit: int = 160) -> str:
    """An error as one short line for a warning (Gloo's messages run to several sentences)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[:limit - 3] + "..."


def _keep_alive(group: dist.ProcessGroup) -> None:
    """Never frees `group`. A Gloo group's destructor joins its worker threads, which a
    collective waiting for a stopped peer holds until Gloo's own timeout (30 min by
    default): freed at uninstall or at interpreter exit, the group would hold the process
    that long. Kept referenced, it ends with the process."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))

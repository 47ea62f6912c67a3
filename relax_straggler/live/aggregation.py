"""Gathering the per-rank payload to the metrics rank over a side Gloo group.

docs/ARCHITECTURE.md invariant 4: the gather runs on a process group created for us at install (Gloo, CPU
tensors), never on the training groups, and never with a barrier. It is asynchronous:
the training thread only launches it; the metrics rank's report thread waits for it.
Every rank joins every gather of a sampled step, also with an empty (all-NaN) payload,
so the ranks stay in lockstep. The per-op row of the live what-if (payload.pack_ops)
travels appended to the stage row in the same gather, and after it two numbers: the
failure this rank asks the metrics rank to stop the analysis for, if any (its code and
step; relax_straggler.common.side_failure).

Nothing here waits on the training thread: poll() only looks at the unfinished gathers. A
gather that failed (a rank gone), or one unfinished for STALL_TIMEOUT_S (a rank stopped),
is this rank's `failure`; what follows from it (every rank ends the analysis at the same
step) is the metrics rank's decision (relax_straggler.live.lockstep). A finished collective is
told from a failed one by relax_straggler.live.works, never by a wait's timeout. A group left
with a collective waiting for a stopped rank is never freed, nor that collective
(relax_straggler.live.works.never_free): neither uninstall nor the process exit waits for Gloo's
timeout, and the exit cannot abort.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.common.payload import ROW_LEN, PendingRows
from relax_straggler.common.side_failure import GATHER_FAILED, GATHER_STUCK, SideFailure
from relax_straggler.live.works import Outcome, never_free, outcome, reason

log = logging.getLogger(__name__)

# Seconds a gather may stay unfinished before this rank takes a peer for stopped: far above
# any wait of a live run (ranks in lockstep join within a step of each other), and costless
# meanwhile, since nothing waits for it.
STALL_TIMEOUT_S = 300.0
# Unfinished gathers past which this rank gives up too (their buffers are held meanwhile).
MAX_UNFINISHED = 4096
_POLL_S = 0.05  # how often a waiting report thread checks for shutdown
STATUS_LEN = 2  # (failure code, its step) after each rank's rows; code 0: none


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
    """The metrics rank's handle on one gather: table (ranks, ROW_LEN + per-op row length +
    STATUS_LEN), filled by Gloo when the work completes."""

    def __init__(self, work: dist.Work, table: torch.Tensor, owner: SideGroupGather) -> None:
        self._work = work
        self._table = table
        self._owner = owner

    def _all(self) -> np.ndarray:
        self._owner.wait_for(self._work)
        return self._table.numpy()

    def wait(self) -> np.ndarray:
        """The stage rows; raises GatherUnavailable when they will never come."""
        return self._all()[:, :ROW_LEN]

    def op_rows(self) -> np.ndarray:
        """The per-op rows (ranks, op_row_len) that travelled with the stage rows."""
        return self._all()[:, ROW_LEN:-STATUS_LEN]


def _joined(row: np.ndarray, op_row: Optional[np.ndarray], request: Optional[SideFailure] = None) -> np.ndarray:
    """One float64 vector: the stage row, then the per-op row if any (one gather for both),
    then the failure `request` asks to stop for, as (code, step) or (0, 0)."""
    status = np.zeros(STATUS_LEN) if request is None else np.array([request.code, request.step], dtype=np.float64)
    parts = [row, status] if op_row is None else [row, op_row, status]
    return np.concatenate(parts).astype(np.float64, copy=False)


@dataclass
class _Launched:
    """One gather this rank launched and has not seen finish."""

    step: int
    at: float  # time.monotonic() of the launch
    work: dist.Work
    table: Optional[torch.Tensor]  # the metrics rank's rows, None elsewhere


class LocalGather:
    """Single process (torch.distributed not initialized): the one row is the matrix."""

    rank = 0
    world_size = 1
    is_metrics_rank = True
    failure: Optional[SideFailure] = None
    requested: Optional[SideFailure] = None

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None, step: int = -1,
               request: Optional[SideFailure] = None) -> Optional[PendingRows]:
        return _Ready(_joined(row, op_row)[:-STATUS_LEN].reshape(1, -1))

    def poll(self) -> None:
        pass

    def oldest_unfinished_step(self) -> Optional[int]:
        return None

    def stop(self, failure: SideFailure) -> None:
        pass

    def abandon(self) -> None:
        pass

    def close(self, timeout_s: float = 5.0, clean: bool = True) -> bool:
        return True


class SideGroupGather:
    """Async gather of one ROW_LEN float64 row per rank to the metrics rank.

    ranks: global ranks analyzed together (the training group's ranks); metrics_rank is
    an index into them. Creating the side group is collective over the default group:
    every process must construct a SideGroupGather at the same point (install does).
    Nothing waits on the training thread: gather() launches, poll() looks. `failure` is
    the first failure this rank saw (a gather failed, or one unfinished for
    STALL_TIMEOUT_S or behind MAX_UNFINISHED others); on the metrics rank `requested` is
    the first failure another rank asked to stop for, read from the finished gathers. A
    failure changes nothing here: the analysis goes on until the metrics rank's decision
    stops it on every rank (stop()).
    """

    def __init__(self, ranks: Sequence[int], metrics_rank: int) -> None:
        if not 0 <= metrics_rank < len(ranks):
            raise ValueError(f"--straggler-metrics-rank {metrics_rank} is not a rank of the analyzed group "
                             f"(size {len(ranks)})")
        self._ranks = list(ranks)
        self.group = dist.new_group(ranks=self._ranks, backend="gloo")
        self.groups = [self.group]  # every group of the side channel (the collective layer leaves them out)
        me = dist.get_rank()
        self.global_rank = me
        self.rank = self._ranks.index(me) if me in self._ranks else -1
        self.world_size = len(self._ranks)
        self._dst = self._ranks[metrics_rank]
        self.metrics_global_rank = self._dst  # the global rank of the metrics rank
        self.is_metrics_rank = me == self._dst
        self._pending: collections.deque[_Launched] = collections.deque()  # unfinished, oldest first
        self.failure: Optional[SideFailure] = None
        self.requested: Optional[SideFailure] = None
        self._stopped: Optional[SideFailure] = None
        self._abandoned = threading.Event()

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None, step: int = -1,
               request: Optional[SideFailure] = None) -> Optional[PendingRows]:
        """Launches the gather of the stage row and, appended to it in the same tensor, the
        per-op row (relax_straggler.common.payload.pack_ops; every rank gives one of the same
        length, or every rank none) and the failure `request` this rank asks to stop for;
        step: the sampled step (for failures). Returns the rows' handle on the metrics rank,
        else None (also once the analysis stopped on this rank)."""
        if self.rank < 0 or self._stopped is not None:
            return None  # not in the analyzed group, or the analysis stopped
        send = torch.from_numpy(_joined(row, op_row, request))
        table = torch.empty(self.world_size, len(send), dtype=torch.float64) if self.is_metrics_rank else None
        work = dist.gather(send, gather_list=list(table.unbind(0)) if table is not None else None, dst=self._dst,
                           group=self.group, async_op=True)
        self._pending.append(_Launched(step, time.monotonic(), work, table))
        self.poll()
        return _InFlight(work, table, self) if table is not None else None

    def poll(self) -> None:
        """Forgets the finished gathers, oldest first, without waiting: a failed one is this
        rank's failure; on the metrics rank a finished one's status column gives the first
        stop another rank asked for (`requested`). The oldest unfinished for STALL_TIMEOUT_S,
        or more than MAX_UNFINISHED unfinished, is this rank's failure too."""
        while self._pending and self._pending[0].work.is_completed():
            launched = self._pending.popleft()
            state, exc = outcome(launched.work)
            if state is Outcome.FAILED:
                self._fail(SideFailure(self.global_rank, GATHER_FAILED, launched.step, reason(exc)))
            elif launched.table is not None and self.requested is None:
                codes = launched.table[:, -STATUS_LEN].numpy()
                asking = np.flatnonzero(codes > 0)
                if len(asking):
                    i = int(asking[0])
                    self.requested = SideFailure(self._ranks[i], int(codes[i]),
                                                 int(launched.table[i, -1].item()))
        if not self._pending:
            return
        now = time.monotonic()
        oldest = self._pending[0]
        if now - oldest.at > STALL_TIMEOUT_S:
            self._fail(SideFailure(self.global_rank, GATHER_STUCK, oldest.step,
                                   f"unfinished for {now - oldest.at:.0f} s"))
        elif len(self._pending) > MAX_UNFINISHED:
            self._fail(SideFailure(self.global_rank, GATHER_STUCK, oldest.step,
                                   f"{len(self._pending)} gathers unfinished"))

    def oldest_unfinished_step(self) -> Optional[int]:
        """The step of this rank's oldest unfinished gather (as of the last poll), None when all finished."""
        return self._pending[0].step if self._pending else None

    def stop(self, failure: SideFailure) -> None:
        """The analysis stopped on this rank: no gather is launched from now on, and a report
        thread waiting for rows that will never come is released."""
        self._stopped = failure

    def wait_for(self, work: dist.Work) -> None:
        """Waits for one gather (the metrics rank's report thread). Raises GatherUnavailable
        when it failed, when the analysis stopped meanwhile, or when abandon() was called."""
        while True:
            state, exc = outcome(work, _POLL_S)
            if state is Outcome.SUCCEEDED:
                return
            if state is Outcome.FAILED:
                raise GatherUnavailable(reason(exc))
            if self._abandoned.is_set() or self._stopped is not None:
                raise GatherUnavailable("the analysis stopped" if self._stopped is not None else "abandoned at shutdown")

    def abandon(self) -> None:
        """Releases a report thread waiting in wait_for (shutdown gave up on it)."""
        self._abandoned.set()

    def close(self, timeout_s: float = 5.0, clean: bool = True) -> bool:
        """Waits at most timeout_s s for this rank's unfinished gathers, then releases the
        side group (no wait once the analysis stopped on this rank). clean=False: another
        collective on the group (the decisions' broadcast) may be unfinished. Returns True
        when the group was destroyed; False when an unfinished collective kept it (see
        relax_straggler.live.works.never_free)."""
        self._abandoned.set()
        deadline = time.monotonic() + (0.0 if self._stopped is not None else timeout_s)
        while clean and self._pending:
            state, _ = outcome(self._pending[0].work, max(deadline - time.monotonic(), 0.0))
            if state is Outcome.RUNNING:
                clean = False
                break
            self._pending.popleft()
        unfinished = [launched.work for launched in self._pending]
        self._pending.clear()
        group, self.group = self.group, None
        if group is None or self.rank < 0:
            return True
        if not clean:
            never_free(group, *unfinished)
            log.warning("relax_straggler: a side-group collective still waits for a stopped rank; the group is "
                        "released at process exit instead of being waited for")
        dist.destroy_process_group(group)
        return clean

    def _fail(self, failure: SideFailure) -> None:
        if self.failure is None:
            self.failure = failure

"""Gathering the per-rank payload to the metrics rank over a side Gloo group.

docs/ARCHITECTURE.md invariant 4: the gather runs on a process group created for us at install (Gloo, CPU
tensors), never on the training groups, and never with a barrier. It is asynchronous:
the training thread only launches it; the metrics rank's report thread waits for it.
Every rank joins every gather of a sampled step, also with an empty (all-NaN) payload,
so the ranks stay in lockstep. The per-op row of the live what-if (payload.pack_ops)
travels appended to the stage row in the same gather.
"""

from __future__ import annotations

import collections
import logging
from typing import Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.payload import ROW_LEN, PendingRows

log = logging.getLogger(__name__)


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
    def __init__(self, work: dist.Work, buffers: list[torch.Tensor]) -> None:
        self._work = work
        self._buffers = buffers
        self._rows: Optional[np.ndarray] = None

    def _all(self) -> np.ndarray:
        if self._rows is None:
            self._work.wait()
            self._rows = torch.stack(self._buffers).numpy()
        return self._rows

    def wait(self) -> np.ndarray:
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

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None) -> Optional[PendingRows]:
        return _Ready(_joined(row, op_row).reshape(1, -1))

    def close(self) -> None:
        pass


class SideGroupGather:
    """Async gather of one ROW_LEN float64 row per rank to the metrics rank.

    ranks: global ranks analyzed together (the training group's ranks); metrics_rank is
    an index into them. Creating the side group is collective over the default group:
    every process must construct a SideGroupGather at the same point (install does).
    At most `max_pending` gathers stay unfinished on a rank; beyond that the oldest is
    waited for and counted in `stalls` (only if the metrics rank falls far behind).
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
        self._pending: collections.deque[dist.Work] = collections.deque()
        self._max_pending = max_pending
        self.stalls = 0

    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None) -> Optional[PendingRows]:
        """Launches the gather of the stage row and, appended to it in the same tensor, the
        per-op row (relax_straggler.payload.pack_ops; every rank gives one of the same
        length, or every rank none); returns the rows' handle on the metrics rank, else None."""
        if self.rank < 0:
            return None  # this process is not in the analyzed group
        send = torch.from_numpy(_joined(row, op_row))
        buffers = [torch.empty(len(send), dtype=torch.float64) for _ in range(self.world_size)] if self.is_metrics_rank else None
        work = dist.gather(send, gather_list=buffers, dst=self._dst, group=self.group, async_op=True)
        if self.is_metrics_rank:
            return _InFlight(work, buffers)
        self._track(work)
        return None

    def _track(self, work: dist.Work) -> None:
        while self._pending and self._pending[0].is_completed():
            self._pending.popleft()
        self._pending.append(work)
        if len(self._pending) > self._max_pending:
            self.stalls += 1
            if self.stalls == 1:
                log.warning("relax_straggler: the metrics rank is %d gathers behind; waiting for it", self._max_pending)
            self._pending.popleft().wait()

    def close(self) -> None:
        """Waits for this rank's outstanding gathers, then releases the side group."""
        for work in self._pending:
            work.wait()
        self._pending.clear()
        if self.group is not None and self.rank >= 0:
            dist.destroy_process_group(self.group)
        self.group = None

"""The metrics rank's decisions, applied by every rank at the same step: whether the coming
period samples, the operator's runtime-control command (relax_straggler.live.control), and the
end of the analysis.

Every `every` steps (--straggler-control-every) each rank joins one async broadcast of a
fixed float64 row from the metrics rank over the side group: the decision. A decision
launched at step s is read at step s + depth x every, where depth x every >= MIN_LAG_STEPS,
and applied from the next step on. Training keeps the ranks within a step or so of each
other, so the broadcast finished long before it is read. If it has not, the rank waits at
most one step's time (the previous step's, never more than MAX_GRACE_S): past that, the
metrics rank is stopped, gone or that far behind, and the analysis ends on this rank
(SideGroupFailed); training goes on. The metrics rank never waits: it knows its own
decisions.

What the metrics rank decides, from what it sees when it launches the decision:
  stop   a failure it saw, or one another rank asked to stop for in its gathered rows
         (relax_straggler.common.side_failure): every rank ends the analysis at the same step
         and names the same failure.
  hold   it is behind: one of its gathers from before the previous decision is still
         unfinished (a rank that far behind), or its report queue is half full (the
         report thread behind). The coming period samples nothing, on every rank alike;
         the next decision resumes sampling when the backlog is gone.
  stack  a rank newly confirmed a straggler, which then samples its training thread's
         Python stack on its next sampled steps (relax_straggler.live.stack_sampler); -1: none.
Nothing else travels: there is no other wait and no other message.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.common.side_failure import DECISION_FAILED, DECISION_LATE, SideFailure
from relax_straggler.live.control import ControlCommand, ControlFile
from relax_straggler.live.works import Outcome, never_free, outcome, reason

MIN_LAG_STEPS = 16  # steps between a decision's broadcast and its use, at least
MAX_GRACE_S = 1.0  # the longest a rank waits for a late decision (also at most one step)


def depth_for(every: int) -> int:
    """Broadcasts between a decision's launch and its use: depth x every >= MIN_LAG_STEPS."""
    return max(1, math.ceil(MIN_LAG_STEPS / every))


@dataclass(frozen=True)
class Decision:
    """What every rank applies from the step after the one it is read at. command: the
    operator's command read from the control file, or None; hold: the period samples
    nothing (the metrics rank is behind); stop: the analysis ends, for this failure;
    stack_rank: the rank (index in the analyzed group) that samples its stack, -1 none."""

    command: Optional[ControlCommand] = None
    hold: bool = False
    stop: Optional[SideFailure] = None
    stack_rank: int = -1


class SideGroupFailed(RuntimeError):
    """The decision due now could not be read: the analysis ends on this rank (failure)."""

    def __init__(self, failure: SideFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


def encode(sequence: int, decision: Decision) -> np.ndarray:
    # [sequence, enabled (-1 unchanged, 0, 1), interval (0 unchanged), relative_threshold,
    # absolute_ms_threshold (NaN unchanged), hold (0, 1), stop code (0: none), stop rank, stop step,
    # stack rank (-1: none)]
    row = np.array([sequence, -1, 0, math.nan, math.nan, 0, 0, -1, -1, decision.stack_rank], dtype=np.float64)
    command = decision.command
    if command is not None:
        if command.enabled is not None:
            row[1] = float(command.enabled)
        if command.interval is not None:
            row[2] = command.interval
        if command.relative_threshold is not None:
            row[3] = command.relative_threshold
        if command.absolute_ms_threshold is not None:
            row[4] = command.absolute_ms_threshold
    row[5] = float(decision.hold)
    if decision.stop is not None:
        row[6:9] = (decision.stop.code, decision.stop.rank, decision.stop.step)
    return row


def decode(row: np.ndarray) -> Decision:
    command = ControlCommand(None if row[1] < 0 else bool(row[1]), None if row[2] < 1 else int(row[2]),
                             None if math.isnan(row[3]) else float(row[3]),
                             None if math.isnan(row[4]) else float(row[4]))
    stop = SideFailure(int(row[7]), int(row[6]), int(row[8])) if row[6] > 0 else None
    return Decision(command if command.changes() else None, bool(row[5]), stop, int(row[9]))


_ROW = len(encode(0, Decision()))


class _Lockstep:
    """What both kinds of lockstep share: a decision every `every` steps (>= 1, else
    ValueError), read `depth` decisions after its launch, made from the operator's control
    file (the metrics rank's ControlFile; None elsewhere or without one)."""

    def __init__(self, control_file: Optional[ControlFile], every: int) -> None:
        if every < 1:
            raise ValueError(f"--straggler-control-every must be >= 1, got {every}")
        self._file, self.every = control_file, every
        self.depth = depth_for(every)

    @property
    def refused(self) -> int:
        """Malformed commands refused (metrics rank; 0 elsewhere)."""
        return self._file.refused if self._file is not None else 0

    def _launched(self, decide: Callable[[], tuple[bool, Optional[SideFailure]]],
                  stack_rank: Optional[Callable[[], int]]) -> Decision:
        """The metrics rank's decision as it launches it: the command read from the control
        file now, (hold, stop) from decide(), the rank stack_rank() names (-1 without it)."""
        hold, stop = decide()
        return Decision(self._file.poll() if self._file is not None else None, hold, stop,
                        stack_rank() if stack_rank is not None else -1)


class LockstepChannel(_Lockstep):
    """Carries the metrics rank's decisions to every rank of the side group.

    group / source: the side Gloo group and the global rank of the metrics rank; rank:
    this global rank; control_file: the metrics rank's ControlFile, if any (None
    elsewhere); every: steps between decisions (>= 1). at_step(step, decide, grace_s) is
    called by every rank at the end of every step; at a decision step it returns the
    decision to apply from the next step on, identical on every rank (None before the
    first is due), and launches the next one: on the metrics rank decide() -> (hold, stop)
    says what it is, and stack_rank(), when given, the rank asked for its stack. Raises SideGroupFailed when the decision due could not be read within
    grace_s (capped at MAX_GRACE_S) or its broadcast failed.
    """

    def __init__(self, group: Any, source: int, rank: int, control_file: Optional[ControlFile], every: int) -> None:
        super().__init__(control_file, every)
        self._group, self._source, self._rank = group, source, rank
        self.is_source = rank == source
        self._sequence = 0
        # (step, work, buffer, the decision sent: the metrics rank's own copy) of each decision not yet due.
        self._due: collections.deque[tuple[int, Any, torch.Tensor, Optional[Decision]]] = collections.deque()
        self._sent: list[Any] = []  # the metrics rank's broadcasts already applied, kept until they finish

    def at_step(self, step: int, decide: Callable[[], tuple[bool, Optional[SideFailure]]],
                grace_s: float, stack_rank: Optional[Callable[[], int]] = None) -> Optional[Decision]:
        if step % self.every:
            return None
        applied = None
        if len(self._due) >= self.depth:
            launched, work, buffer, own = self._due.popleft()
            if own is not None:  # the metrics rank applies what it sent, whoever has received it yet
                applied = own
                self._sent = [w for w in self._sent if not w.is_completed()] + [work]
            else:
                state, exc = outcome(work, min(grace_s, MAX_GRACE_S))
                if state is Outcome.RUNNING:
                    raise SideGroupFailed(SideFailure(self._rank, DECISION_LATE, step,
                                                      f"broadcast at step {launched}"))
                if state is Outcome.FAILED:
                    raise SideGroupFailed(SideFailure(self._rank, DECISION_FAILED, step, reason(exc)))
                row = buffer.numpy()
                if row[0] != self._sequence - len(self._due):  # the broadcasts paired out of order
                    raise SideGroupFailed(SideFailure(self._rank, DECISION_FAILED, step,
                                                      f"decision #{row[0]:.0f} came where #"
                                                      f"{self._sequence - len(self._due)} was due"))
                applied = decode(row)
        self._sequence += 1
        own = None
        if self.is_source:
            own = self._launched(decide, stack_rank)
            buffer = torch.from_numpy(encode(self._sequence, own))
        else:
            buffer = torch.full((_ROW,), math.nan, dtype=torch.float64)
        work = dist.broadcast(buffer, src=self._source, group=self._group, async_op=True)
        self._due.append((step, work, buffer, own))
        return applied

    def close(self, timeout_s: float = 5.0) -> bool:
        """Waits at most timeout_s s for the broadcasts launched (every rank launched the same
        ones), before the group goes. False when one is still unfinished (a rank stopped)
        or failed."""
        works = self._sent + [work for _, work, _, _ in self._due]
        self._sent, self._due = [], collections.deque()
        deadline = time.monotonic() + timeout_s
        for i, work in enumerate(works):
            state, _ = outcome(work, max(deadline - time.monotonic(), 0.0))
            if state is Outcome.RUNNING:
                never_free(*works[i:])
            if state is not Outcome.SUCCEEDED:
                return False
        return True


class LocalLockstep(_Lockstep):
    """LockstepChannel for a single process (torch.distributed not initialized): the same
    cadence and lag, decide() taken at launch and applied depth decisions later."""

    def __init__(self, control_file: Optional[ControlFile], every: int) -> None:
        super().__init__(control_file, every)
        self._due: collections.deque[Decision] = collections.deque()

    def at_step(self, step: int, decide: Callable[[], tuple[bool, Optional[SideFailure]]],
                grace_s: float, stack_rank: Optional[Callable[[], int]] = None) -> Optional[Decision]:
        if step % self.every:
            return None
        applied = self._due.popleft() if len(self._due) >= self.depth else None
        self._due.append(self._launched(decide, stack_rank))
        return applied

    def close(self, timeout_s: float = 5.0) -> bool:
        return True


"""The hierarchical side channel: each node's ranks gather to a node leader, the leaders to
the metrics rank through a tree of groups of at most `fanout` leaders.

The plan (plan()) is computed alike on every rank from the analyzed ranks alone. Level 0 has
one group per node (consecutive ranks, as torchrun numbers them), rooted at its first rank,
or at the metrics rank in its node. Level k + 1 groups the roots of level k, `fanout` at a
time in order, rooted the same way; the last level has one group, rooted at the metrics
rank. A root's rows after its gather are its members' rows, concatenated in member order;
every member of a level sends a block of the same number of rows (the level's widest,
padded with NaN), since a Gloo gather takes tensors of one size. The metrics rank puts the
rows back in the analyzed order: the table is the flat gather's, row for row and bit for bit.

What the flat path promises holds at each level (relax_straggler.live.aggregation):
  - The training thread never waits: it launches the node gather and returns. A leader's
    relay thread waits for its node's rows and launches the next level's gather with them,
    in step order (every root of a level does the same, so every group's collectives pair
    in order).
  - A gather that failed is a failure of the rank that saw it, naming whom it exchanged
    with: a member names its leader (a member's only peer in a gather is its root); a
    root names its group's other members. A root whose gather failed still sends its
    block up, with its own row (asking to stop for the failure) and NaN for the rows that
    did not come, so the levels above stay in lockstep and the metrics rank hears of it in
    that step's rows. A step with missing rows has no report (GatherUnavailable), as the
    flat gather that failed has none.
  - A gather unfinished for STALL_TIMEOUT_S, or too many unfinished, is GATHER_STUCK;
    what follows (every rank stops at one step) is the metrics rank's decision
    (relax_straggler.live.lockstep), carried by a broadcast over one group of every analyzed
    rank (`group`), created with lazy connections where the torch has them (a rank then
    connects only to its peers in the broadcast's tree; where it has not, that group is a
    full mesh, as the flat channel's).
"""

from __future__ import annotations

import collections
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler.common.payload import ROW_LEN
from relax_straggler.common.side_failure import GATHER_FAILED, GATHER_STUCK, SideFailure
from relax_straggler.live import aggregation
from relax_straggler.live.aggregation import STATUS_LEN, GatherUnavailable, _joined
from relax_straggler.live.lazy_gloo import lazy_connections
from relax_straggler.live.works import Outcome, never_free, outcome, reason

log = logging.getLogger(__name__)

_POLL_S = 0.05  # how often a waiting relay or report thread checks for shutdown
_NAMED = 4  # peers a failure names before it counts the rest


@dataclass(frozen=True)
class TreeGroup:
    """One gather of the tree. members: indices into the analyzed ranks, in gather order;
    root: the member that receives; rows: the analyzed indices of the rows the root holds
    after the gather, in order (each member's rows, concatenated)."""

    members: tuple[int, ...]
    root: int
    rows: tuple[int, ...]


def plan(ranks: Sequence[int], metrics: int, node_size: int, fanout: int) -> list[list[TreeGroup]]:
    """The tree's levels, bottom up (see the module docstring). ranks: the analyzed global
    ranks; metrics: the metrics rank's index into them; node_size: ranks per node (node of
    global rank r: r // node_size); fanout: members per group above level 0 (>= 2). The last
    level has one group, rooted at `metrics`. Raises ValueError on a bad argument."""
    if node_size < 1 or fanout < 2:
        raise ValueError(f"plan: node_size must be >= 1 and fanout >= 2, got {node_size}, {fanout}")
    if not 0 <= metrics < len(ranks):
        raise ValueError(f"plan: metrics rank index {metrics} is outside the {len(ranks)} analyzed ranks")
    nodes: dict[int, list[int]] = {}
    for i, r in enumerate(ranks):
        nodes.setdefault(r // node_size, []).append(i)

    def group(members: Sequence[int], rows: Sequence[int]) -> TreeGroup:
        return TreeGroup(tuple(members), metrics if metrics in members else members[0], tuple(rows))

    levels = [[group(m, m) for m in nodes.values()]]
    while len(levels[-1]) > 1:
        below = levels[-1]
        levels.append([group([g.root for g in below[i:i + fanout]], [r for g in below[i:i + fanout] for r in g.rows])
                       for i in range(0, len(below), fanout)])
    return levels


def _compact(ranks: Sequence[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:_NAMED])
    return shown if len(ranks) <= _NAMED else f"{shown} and {len(ranks) - _NAMED} more"


@dataclass
class _Hop:
    """This rank's part in one level: its group of the plan and process group, the rows of a
    member's block (the widest group's below), whether it is the root, the root's global
    rank, the other members' global ranks and the rows each member sends."""

    level: int
    tree: TreeGroup
    pg: Any
    width: int
    is_root: bool
    root_global: int
    peers: tuple[int, ...]  # global ranks of the other members
    counts: tuple[int, ...]  # rows each member sends (its own at level 0, its group's below)


@dataclass
class _Step:
    """One sampled step as this rank sees it: its works not yet seen finish, and whether its
    relay is done with it (no relay: done)."""

    step: int
    at: float
    works: list = field(default_factory=list)  # (work, hop)
    relayed: bool = True


class _Delivery:
    """The metrics rank's handle on one step's rows: filled by its relay thread."""

    def __init__(self, owner: "TreeGather") -> None:
        self._owner = owner
        self._done = threading.Event()
        self.table: Optional[np.ndarray] = None
        self.missing: list[int] = []
        self.error: Optional[str] = None

    def deliver(self, table: Optional[np.ndarray], error: Optional[str] = None) -> None:
        self.table, self.error = table, error
        if table is not None:
            self.missing = [int(i) for i in np.flatnonzero(np.isnan(table[:, 0]))]
        self._done.set()

    def _all(self) -> np.ndarray:
        while not self._done.wait(_POLL_S):
            if self._owner._abandoned.is_set() or self._owner._stopped is not None:
                raise GatherUnavailable("the analysis stopped" if self._owner._stopped is not None
                                        else "abandoned at shutdown")
        if self.table is None:
            raise GatherUnavailable(self.error or "the rows never came")
        if self.missing:
            missed = [self._owner._ranks[i] for i in self.missing]
            raise GatherUnavailable(f"the rows of rank(s) {_compact(missed)} never came")
        return self.table

    def wait(self) -> np.ndarray:
        """The stage rows, (ranks, ROW_LEN); raises GatherUnavailable when some never come."""
        return self._all()[:, :ROW_LEN]

    def op_rows(self) -> np.ndarray:
        """The per-op rows (ranks, op_row_len) that travelled with the stage rows."""
        return self._all()[:, ROW_LEN:-STATUS_LEN]


class TreeGather:
    """The hierarchical side channel, with SideGroupGather's interface and rules (see the
    module docstring). ranks: the analyzed global ranks; metrics_rank: an index into them;
    node_size: ranks per node; fanout: leaders per group above the nodes. Collective over
    the default group: every process constructs one at the same point, with the same
    arguments. Raises ValueError for a bad metrics_rank, node_size or fanout."""

    def __init__(self, ranks: Sequence[int], metrics_rank: int, node_size: int, fanout: int) -> None:
        if not 0 <= metrics_rank < len(ranks):
            raise ValueError(f"--straggler-metrics-rank {metrics_rank} is not a rank of the analyzed group "
                             f"(size {len(ranks)})")
        self._ranks = list(ranks)
        self.levels = plan(self._ranks, metrics_rank, node_size, fanout)
        me = dist.get_rank()
        self.global_rank = me
        self.rank = self._ranks.index(me) if me in self._ranks else -1
        self.world_size = len(self._ranks)
        self.metrics_global_rank = self._ranks[metrics_rank]
        self.is_metrics_rank = me == self.metrics_global_rank
        # Every process creates every group in the same order (torch.distributed's rule);
        # a group it is not in costs it no connection.
        # The decisions' broadcast: lazy connections where the torch has them, so a rank
        # connects to its peers in the broadcast's tree only (a full mesh elsewhere).
        with lazy_connections(True):
            self.group = dist.new_group(ranks=self._ranks, backend="gloo")
        self._hops: list[_Hop] = []
        width = 1
        for k, level in enumerate(self.levels):
            widest = max(len(g.rows) for g in level)
            for g in level:
                members = [self._ranks[i] for i in g.members]
                pg = dist.new_group(ranks=members, backend="gloo")
                if self.rank in g.members:  # a member above level 0 is the root of its group below
                    below = {b.root: len(b.rows) for b in self.levels[k - 1]} if k else {}
                    self._hops.append(_Hop(k, g, pg, width, self.rank == g.root, self._ranks[g.root],
                                           tuple(r for r in members if r != me),
                                           tuple(below.get(m, 1) for m in g.members)))
            width = widest
        self.groups = [self.group] + [h.pg for h in self._hops]
        self._steps: collections.deque[_Step] = collections.deque()  # unfinished, oldest first
        self._lock = threading.Lock()  # _steps and each _Step's works (the relay adds to them)
        self.failure: Optional[SideFailure] = None
        self.requested: Optional[SideFailure] = None
        self._stopped: Optional[SideFailure] = None
        self._abandoned = threading.Event()
        self._closing = threading.Event()
        self._relay: Optional[threading.Thread] = None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        if self.rank >= 0 and self._hops[0].is_root and (len(self._hops) > 1 or self.is_metrics_rank):
            self._relay = threading.Thread(target=self._relay_loop, name="relax_straggler-side-relay", daemon=True)
            self._relay.start()

    # the training thread ---------------------------------------------------------------
    def gather(self, row: np.ndarray, op_row: Optional[np.ndarray] = None, step: int = -1,
               request: Optional[SideFailure] = None) -> Optional[_Delivery]:
        """As SideGroupGather.gather: launches this rank's node gather and returns (the
        metrics rank's handle on the step's rows, else None)."""
        if self.rank < 0 or self._stopped is not None:
            return None
        send = torch.from_numpy(_joined(row, op_row, request))
        hop = self._hops[0]
        table = torch.empty(len(hop.tree.members), len(send), dtype=torch.float64) if hop.is_root else None
        work = dist.gather(send, gather_list=list(table.unbind(0)) if table is not None else None,
                           dst=hop.root_global, group=hop.pg, async_op=True)
        entry = _Step(step, time.monotonic(), [(work, hop)], relayed=self._relay is None)
        with self._lock:
            self._steps.append(entry)
        delivery = _Delivery(self) if self.is_metrics_rank else None
        if self._relay is not None:
            self._inbox.put((entry, work, table, send.numpy(), delivery))
        self.poll()
        return delivery

    def poll(self) -> None:
        """As SideGroupGather.poll: forgets the steps whose works all finished and whose relay
        is done; a failed work is this rank's failure (naming its peers); the oldest
        unfinished for STALL_TIMEOUT_S, or more than MAX_UNFINISHED unfinished, too."""
        with self._lock:
            while self._steps:
                entry = self._steps[0]
                while entry.works and entry.works[0][0].is_completed():
                    work, hop = entry.works.pop(0)
                    state, exc = outcome(work)
                    if state is Outcome.FAILED:
                        self._fail(SideFailure(self.global_rank, GATHER_FAILED, entry.step, _failed(hop, exc)))
                if entry.works or not entry.relayed:
                    break
                self._steps.popleft()
            if not self._steps:
                return
            oldest, count = self._steps[0], len(self._steps)
            waiting = oldest.works[0][1] if oldest.works else None
        now = time.monotonic()
        if now - oldest.at > aggregation.STALL_TIMEOUT_S:
            on = "" if waiting is None else f", {_peers(waiting)}"
            self._fail(SideFailure(self.global_rank, GATHER_STUCK, oldest.step,
                                   f"unfinished for {now - oldest.at:.0f} s{on}"))
        elif count > aggregation.MAX_UNFINISHED:
            self._fail(SideFailure(self.global_rank, GATHER_STUCK, oldest.step, f"{count} gathers unfinished"))

    def oldest_unfinished_step(self) -> Optional[int]:
        """The step of this rank's oldest unfinished gather or relay (as of the last poll)."""
        with self._lock:
            return self._steps[0].step if self._steps else None

    def stop(self, failure: SideFailure) -> None:
        """The analysis stopped on this rank: no gather is launched from now on (the relay
        still forwards the steps launched before, so the levels above can finish them)."""
        self._stopped = failure

    def abandon(self) -> None:
        """Releases a report thread waiting for rows (shutdown gave up on them)."""
        self._abandoned.set()

    def close(self, timeout_s: float = 5.0, clean: bool = True) -> bool:
        """As SideGroupGather.close: waits at most timeout_s s for this rank's unfinished
        gathers and relay (none once the analysis stopped), ends the relay and releases the
        groups, or keeps them for the process's life when a collective is unfinished."""
        self._abandoned.set()
        deadline = time.monotonic() + (0.0 if self._stopped is not None else timeout_s)
        while clean:
            self.poll()
            if self.oldest_unfinished_step() is None:
                break
            if time.monotonic() >= deadline:
                clean = False
                break
            time.sleep(min(_POLL_S, max(deadline - time.monotonic(), 0.0)))
        self._closing.set()
        if self._relay is not None:
            self._relay.join(timeout=2 * _POLL_S + 1.0)
            clean = clean and not self._relay.is_alive()
        with self._lock:
            unfinished = [work for entry in self._steps for work in entry.works]
            self._steps.clear()
        groups, self.groups, self.group = self.groups, [], None
        if not groups or self.rank < 0:
            return True
        if not clean:
            never_free(*groups, *unfinished)
            log.warning("relax_straggler: a side-group collective still waits for a stopped rank; the group is "
                        "released at process exit instead of being waited for")
        for g in groups:
            dist.destroy_process_group(g)
        return clean

    def _fail(self, failure: SideFailure) -> None:
        if self.failure is None:
            self.failure = failure

    # the relay thread (node leaders and the metrics rank) ------------------------------
    def _relay_loop(self) -> None:
        """Forwards each step's rows up the levels this rank roots, in step order."""
        while not self._closing.is_set():
            try:
                entry, work, table, own, delivery = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            try:
                self._forward(entry, work, table, own, delivery)
            finally:
                with self._lock:
                    entry.relayed = True
        while True:  # closing: a report thread still waiting is told the rows will not come
            try:
                _, _, _, _, delivery = self._inbox.get_nowait()
            except queue.Empty:
                return
            if delivery is not None:
                delivery.deliver(None, "abandoned at shutdown")

    def _forward(self, entry: _Step, work: Any, table: torch.Tensor, own: np.ndarray,
                 delivery: Optional[_Delivery]) -> None:
        width = len(own)
        for i, hop in enumerate(self._hops):
            state, exc = self._await(work)
            if state is None:  # closing
                if delivery is not None:
                    delivery.deliver(None, "abandoned at shutdown")
                return
            block = self._block(hop, table.numpy().reshape(len(hop.tree.members), hop.width, width), own,
                                entry.step, None if state is Outcome.SUCCEEDED else exc)
            if i + 1 == len(self._hops) and self.is_metrics_rank:  # the top: the rows in the analyzed order
                rows = np.empty_like(block)
                rows[list(hop.tree.rows)] = block
                self._note_request(rows)
                delivery.deliver(rows)
                return
            up = self._hops[i + 1]
            padded = np.full((up.width, width), math.nan)
            padded[:len(block)] = block
            send = torch.from_numpy(padded.ravel())
            table = torch.empty(len(up.tree.members), len(send), dtype=torch.float64) if up.is_root else None
            work = dist.gather(send, gather_list=list(table.unbind(0)) if table is not None else None,
                               dst=up.root_global, group=up.pg, async_op=True)
            with self._lock:
                entry.works.append((work, up))
            if not up.is_root:
                return

    def _await(self, work: Any) -> tuple[Optional[Outcome], Optional[BaseException]]:
        """Waits for `work` until it finishes; (None, None) when the channel closes first."""
        while True:
            state, exc = outcome(work, _POLL_S)
            if state is not Outcome.RUNNING:
                return state, exc
            if self._closing.is_set():
                return None, None

    def _block(self, hop: _Hop, tables: np.ndarray, own: np.ndarray, step: int,
               exc: Optional[BaseException]) -> np.ndarray:
        """The rows of `hop`'s group, in its rows order, from each member's block; when the
        gather failed, NaN but for this rank's own row, which then asks to stop for it."""
        if exc is None:
            return np.concatenate([tables[j, :n] for j, n in enumerate(hop.counts)])
        failure = SideFailure(self.global_rank, GATHER_FAILED, step, _failed(hop, exc))
        self._fail(failure)
        block = np.full((len(hop.tree.rows), len(own)), math.nan)
        mine = own.copy()
        if not mine[-STATUS_LEN] > 0:
            mine[-STATUS_LEN:] = (failure.code, failure.step)
        block[hop.tree.rows.index(self.rank)] = mine
        return block

    def _note_request(self, rows: np.ndarray) -> None:
        """The first stop another rank asked for, from a step's rows (as SideGroupGather.poll)."""
        if self.requested is not None:
            return
        codes = rows[:, -STATUS_LEN]
        asking = np.flatnonzero(codes > 0)
        if len(asking):
            i = int(asking[0])
            self.requested = SideFailure(self._ranks[i], int(codes[i]), int(rows[i, -1]))


def _peers(hop: _Hop) -> str:
    """Whom this rank exchanges with at `hop`'s level: a member its root, a root its members."""
    if not hop.is_root:
        return f"sending to its level-{hop.level} leader, rank {hop.root_global}"
    return f"receiving from rank(s) {_compact(hop.peers)} at level {hop.level}"


def _failed(hop: _Hop, exc: Optional[BaseException]) -> str:
    """A failed gather's detail, naming whom this rank exchanged with at that level."""
    return f"{_peers(hop)}: {reason(exc) if exc is not None else 'failed'}"

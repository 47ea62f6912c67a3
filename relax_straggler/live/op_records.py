"""Per-op records of a sampled step, for the live what-if replay (docs/WHATIF.md, "Live").

On sampled steps each forward/backward compute and pipeline p2p op that the Megatron
adapter times (or that a user wraps in ``analyzer.ops.op(name, microbatch=i)``) is kept
as (op type, microbatch, model chunk, start, duration) on the host clock
(``time.perf_counter``). The step's tail, from the end of its last recorded op to the
step end, is recorded as the ``optimizer`` op. At the step end the ops become one
fixed-size per-op row (relax_straggler.common.payload.pack_ops), gathered with the stage row.

Bounded: at most ``max_ops`` ops per step; the ones past that are counted in
``dropped_ops`` (published as ``straggler/dropped_ops``), and a step that dropped ops is
not replayed. Non-sampled steps cost one flag check (the stage timer's relaxed atomic
``sampled``) per op. Only the host clock is read: on CUDA the times are those of the host,
which match the device only where the chained Megatron Timers synchronize.
"""

from __future__ import annotations

import abc
import contextlib
import time
from typing import Any, ContextManager, Iterator, Optional, Protocol

import numpy as np

from relax_straggler.common.payload import DEFAULT_MAX_OPS, OP_FIELDS, OP_TYPE_IDS, OP_TYPES, pack_ops

_NULL: ContextManager[None] = contextlib.nullcontext()
_TAIL = OP_TYPE_IDS["optimizer"]


def _check_worker(dp_rank: int, stage: int) -> None:
    for name, v in (("dp_rank", dp_rank), ("stage", stage)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"set_worker: {name} must be an integer >= 0, got {v!r}")


def _op_code(name: str) -> int:
    """The OP_TYPES index of a name a user may record (not the synthesised `optimizer` tail)."""
    code = OP_TYPE_IDS.get(name, _TAIL)
    if code == _TAIL:
        raise ValueError(f"op(): {name!r} is not a recorded op type; use one of "
                         f"{', '.join(n for n in OP_TYPES if n != 'optimizer')}")
    return code


class OpRecorderAPI(Protocol):
    """What `analyzer.ops` offers, recording (OpRecorder) or not (NullOpRecorder); both
    check their arguments alike."""

    @property
    @abc.abstractmethod
    def active(self) -> bool:
        """True while the current step is recorded."""

    @abc.abstractmethod
    def set_worker(self, dp_rank: int, stage: int) -> None:
        """This rank's data-parallel rank and pipeline stage (ints >= 0; ValueError otherwise)."""

    @abc.abstractmethod
    def microbatch(self, index: int) -> None:
        """Marks the microbatch of the ops that follow."""

    @abc.abstractmethod
    def op(self, name: str, microbatch: Optional[int] = None, chunk: int = -1) -> ContextManager[None]:
        """A context recording one op named `name` (an OP_TYPES name but `optimizer`; ValueError otherwise)."""

    @abc.abstractmethod
    def start(self, code: int, microbatch: int = -1, chunk: int = -1, numbered: bool = False) -> None:
        """Opens op type `code` (an OP_TYPES index)."""

    @abc.abstractmethod
    def stop(self, code: int) -> None:
        """Closes op type `code`."""

    @abc.abstractmethod
    def take_row(self, step: int) -> Optional[np.ndarray]:
        """Ends a sampled step: its per-op row, None when no row travels with the stage row."""


class OpRecorder(OpRecorderAPI):
    """Records the ops of sampled steps, at most max_ops per step (the step's tail included).

    timer: the analyzer's StageTimer (its ``sampled`` flag gates recording). rank: this
    rank's index in the analyzed group. The worker (dp_rank, pp stage) defaults to
    (rank, 0), a data-parallel job without pipeline; set_worker() gives the real one.
    Raises ValueError for max_ops < 2.
    """

    def __init__(self, timer: Any, rank: int, max_ops: int = DEFAULT_MAX_OPS) -> None:
        if max_ops < 2:
            raise ValueError(f"OpRecorder: max_ops must be >= 2 (one slot is the step's tail), got {max_ops}")
        self._timer = timer
        self.rank = rank
        self.max_ops = max_ops
        self.dp_rank = rank
        self.stage = 0
        self.dropped_ops = 0  # lifetime, steps taken so far
        self._dropped = 0  # in the open step
        self._ops: list[tuple[int, int, int, float, float]] = []  # at most max_ops - 1, then the tail
        self._open: dict[int, tuple[float, int, int]] = {}  # op type -> (start, microbatch, chunk)
        self._microbatch = -1
        self._started = [0] * len(OP_TYPES)  # numbered starts per op type in the open step
        self._t0: Optional[float] = None  # perf_counter of the step's first op

    def set_worker(self, dp_rank: int, stage: int) -> None:
        """This rank's data-parallel rank and pipeline stage (ints >= 0; ValueError otherwise)."""
        _check_worker(dp_rank, stage)
        self.dp_rank, self.stage = dp_rank, stage

    @property
    def active(self) -> bool:
        """True on sampled steps (the stage timer's flag)."""
        return self._timer.sampled

    def microbatch(self, index: int) -> None:
        """Marks the microbatch of the ops that follow (op() without microbatch=)."""
        self._microbatch = int(index)

    def op(self, name: str, microbatch: Optional[int] = None, chunk: int = -1) -> ContextManager[None]:
        """`with ops.op("forward-compute", microbatch=i):` records one op on sampled steps.
        name: one of relax_straggler.common.payload.OP_TYPES except `optimizer` (ValueError otherwise)."""
        code = _op_code(name)
        if not self._timer.sampled:
            return _NULL
        return self._timed(code, self._microbatch if microbatch is None else microbatch, chunk)

    @contextlib.contextmanager
    def _timed(self, code: int, microbatch: int, chunk: int) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self._add(code, microbatch, chunk, start, time.perf_counter() - start)

    def start(self, code: int, microbatch: int = -1, chunk: int = -1, numbered: bool = False) -> None:
        """Opens op type `code` (an OP_TYPES index) on sampled steps; a second start of an
        open type restarts it. numbered: the microbatch is the op's ordinal among the step's
        ops of its type (a compute under the 1F1B or no-pipelining schedule)."""
        if self._timer.sampled:
            if numbered:
                microbatch = self._started[code]
                self._started[code] += 1
            self._open[code] = (time.perf_counter(), microbatch, chunk)

    def stop(self, code: int) -> None:
        """Closes op type `code`; a stop without a start is ignored."""
        if self._open:
            opened = self._open.pop(code, None)
            if opened is not None:
                start, microbatch, chunk = opened
                self._add(code, microbatch, chunk, start, time.perf_counter() - start)

    def _add(self, code: int, microbatch: int, chunk: int, start: float, duration: float) -> None:
        if self._t0 is None:
            self._t0 = start
        if len(self._ops) >= self.max_ops - 1:  # the last slot is the tail's
            self._dropped += 1
            return
        self._ops.append((code, microbatch, chunk, start, duration))

    def take_row(self, step: int) -> np.ndarray:
        """Ends the step: its ops and the tail up to now (as `optimizer`) as one per-op row,
        an empty one when nothing was recorded; then clears the buffer. Call once per
        sampled step, at its end."""
        now_perf, now_wall = time.perf_counter(), time.time()
        t0 = self._t0
        if self._ops and t0 is not None:
            ops = np.empty((len(self._ops) + 1, len(OP_FIELDS)), dtype=np.float64)
            ops[:-1] = self._ops
            tail_start = float(np.max(ops[:-1, 3] + ops[:-1, 4]))
            ops[-1] = (_TAIL, -1, -1, tail_start, max(now_perf - tail_start, 0.0))
            ops[:, 3] -= t0
            t0_wall = now_wall - (now_perf - t0)
        else:
            ops, t0_wall = np.empty((0, len(OP_FIELDS))), float("nan")
        self.dropped_ops += self._dropped
        row = pack_ops(step, self.rank, self.dp_rank, self.stage, self._dropped, self.dropped_ops, t0_wall, ops,
                       self.max_ops)
        self._ops, self._t0, self._dropped = [], None, 0
        self._open.clear()
        self._microbatch = -1
        self._started = [0] * len(OP_TYPES)
        return row


class NullOpRecorder(OpRecorderAPI):
    """The disabled analyzer's recorder: checks its arguments like OpRecorder, records nothing."""

    active = False

    def set_worker(self, dp_rank: int, stage: int) -> None:
        _check_worker(dp_rank, stage)

    def microbatch(self, index: int) -> None:
        pass

    def op(self, name: str, microbatch: Optional[int] = None, chunk: int = -1) -> ContextManager[None]:
        _op_code(name)
        return _NULL

    def start(self, code: int, microbatch: int = -1, chunk: int = -1, numbered: bool = False) -> None:
        pass

    def stop(self, code: int) -> None:
        pass

    def take_row(self, step: int) -> None:
        return None  # no per-op row travels with the stage row


NULL_OPS = NullOpRecorder()

"""The fixed-shape per-rank payload gathered on every sampled step.

One float64 row per rank:
  [step, tokens, rank, comparable_count, group, forward_passes, run_queue_ms,
   gc_ms, gc_count, gc_full_ms, gc_full_count, gc_steps, gc_step_ms]
  (device_ms, host_ms, waited_ms, calls) for every stage in STAGES order
  comparable_ms[MAX_COMPARABLE]: durations of the step's first collectives on groups
  spanning every analyzed rank, in issue order (late-arrival evidence)
  (kernel_ms, idle_ms, nccl_ms) for every stage in STAGES order: what the kernel records of
  the stage's sections say (--straggler-kernel-stats, relax_straggler.live.kernel_evidence)
  stack[STACK_LEN]: the rank's sampled Python stack, on the one step it travels after the
  metrics rank named the rank (relax_straggler.common.stacks; NaN otherwise)
NaN marks "not measured" (no tokens given, stage not run, unused slot, no comparison
group given, forward passes not counted, no kernel records, no run-queue account, no GC account). forward_passes: the
rank's training forward passes so far (a step-drift check: relax_straggler.judge.report.drifted_ranks);
run_queue_ms: how long the rank's training thread waited for a CPU during the step
(relax_straggler.live.run_queue, host contention); gc_*: the process's garbage-collection pauses
over every step since the rank's previous row (GC_FIELDS, relax_straggler.live.gc_pauses). Fixed size
means one tensor gather and no pickling (Megatron Timers do the same).

The per-op row of the live what-if replay (below, `pack_ops`) travels appended to it in
the same gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import numpy as np

from relax_straggler.common.stacks import STACK_LEN
from relax_straggler.common.stages import STAGES

# Garbage-collection pauses over every step since the previous row: pause time (ms) and
# collections, those of full (generation 2) collections, the steps the span covers; and the
# pause time within the sampled step itself (ms).
GC_FIELDS = ("gc_ms", "gc_count", "gc_full_ms", "gc_full_count", "gc_steps", "gc_step_ms")
HEADER = ("step", "tokens", "rank", "comparable_count", "group", "forward_passes", "run_queue_ms") + GC_FIELDS
FIELDS = ("device_ms", "host_ms", "waited_ms", "calls")
MAX_COMPARABLE = 32  # relax_straggler._C.MAX_COMPARABLE_COLLECTIVES
# Per stage, from kernel records: compute (non-NCCL) kernels running, nothing running on the
# section's stream, NCCL kernels running; ms (csrc/cupti/kernel_stats.h).
KERNEL_FIELDS = ("kernel_ms", "idle_ms", "nccl_ms")
_H = len(HEADER)
_GC_AT = HEADER.index(GC_FIELDS[0])
_BODY = len(FIELDS) * len(STAGES)
_KERNEL_AT = _H + _BODY + MAX_COMPARABLE
_STACK_AT = _KERNEL_AT + len(KERNEL_FIELDS) * len(STAGES)
ROW_LEN = _STACK_AT + STACK_LEN


class PendingRows(Protocol):
    """One sampled step's gathered rows, as the report thread receives them."""

    def wait(self) -> np.ndarray:
        """Blocks until all rows arrived; returns (ranks, ROW_LEN) float64."""

    def op_rows(self) -> np.ndarray:
        """After wait(): the per-op rows gathered with the stage rows, (ranks,
        op_row_len(max_ops)) float64, (ranks, 0) when none travelled."""


def pack(step: int, tokens: float, rank: int, device_ms: Sequence[float], host_ms: Sequence[float],
         waited_ms: Sequence[float], calls: Sequence[float], comparable_ms: Sequence[float] = (),
         group: Optional[int] = None, forward_passes: float = np.nan,
         kernel: Optional[np.ndarray] = None, run_queue_ms: float = np.nan,
         gc: Optional[Sequence[float]] = None, stack: Optional[np.ndarray] = None) -> np.ndarray:
    """One rank's row. The per-stage sequences have len(STAGES) entries (ms, NaN = not run);
    group: the rank's comparison group id (>= 0) or None; forward_passes: its training
    forward passes so far, NaN when not counted; run_queue_ms: its training thread's wait for
    a CPU during the step, NaN when not measured; gc: its GC_FIELDS (relax_straggler.live.gc_pauses),
    None = not measured; kernel: (len(STAGES), len(KERNEL_FIELDS)) ms from kernel records,
    None = not measured; stack: (STACK_LEN,) a sampled stack's segment
    (relax_straggler.common.stacks.encode) or None. Raises ValueError on a wrong kernel, gc or stack
    shape."""
    row = np.full(ROW_LEN, np.nan, dtype=np.float64)
    comparable = np.asarray(comparable_ms, dtype=np.float64)[:MAX_COMPARABLE]
    row[0:_GC_AT] = (step, tokens, rank, len(comparable), np.nan if group is None else group, forward_passes,
                     run_queue_ms)
    if gc is not None:
        gc = np.asarray(gc, dtype=np.float64)
        if gc.shape != (len(GC_FIELDS),):
            raise ValueError(f"pack: gc must have shape ({len(GC_FIELDS)},), got {gc.shape}")
        row[_GC_AT:_H] = gc
    body = row[_H:_H + _BODY].reshape(len(STAGES), len(FIELDS))
    body[:, 0] = device_ms
    body[:, 1] = host_ms
    body[:, 2] = waited_ms
    body[:, 3] = calls
    row[_H + _BODY:_H + _BODY + len(comparable)] = comparable
    if kernel is not None:
        kernel = np.asarray(kernel, dtype=np.float64)
        if kernel.shape != (len(STAGES), len(KERNEL_FIELDS)):
            raise ValueError(f"pack: kernel must have shape ({len(STAGES)}, {len(KERNEL_FIELDS)}), got {kernel.shape}")
        row[_KERNEL_AT:_STACK_AT] = kernel.ravel()
    if stack is not None:
        stack = np.asarray(stack, dtype=np.float64)
        if stack.shape != (STACK_LEN,):
            raise ValueError(f"pack: stack must have shape ({STACK_LEN},), got {stack.shape}")
        row[_STACK_AT:] = stack
    return row


@dataclass(frozen=True)
class KernelMatrix:
    """Kernel evidence of ranks x stages (KERNEL_FIELDS), ms, NaN = not measured."""

    kernel_ms: np.ndarray
    idle_ms: np.ndarray
    nccl_ms: np.ndarray

    def select(self, rows: np.ndarray, columns: np.ndarray) -> "KernelMatrix":
        """The cells of boolean or index `columns`, NaN in the rows where `rows` (bool, ranks) is False."""
        def pick(a: np.ndarray) -> np.ndarray:
            out = a[:, columns].copy()
            out[~rows, :] = np.nan
            return out

        return KernelMatrix(pick(self.kernel_ms), pick(self.idle_ms), pick(self.nccl_ms))

    def measured(self) -> bool:
        """Whether some cell holds a measured time."""
        return bool(np.isfinite(self.kernel_ms).any() or np.isfinite(self.idle_ms).any()
                    or np.isfinite(self.nccl_ms).any())


@dataclass(frozen=True)
class GcPauseRows:
    """Each rank's garbage-collection pauses over the steps since its previous row, (ranks,)
    float64 per field of GC_FIELDS (ms, counts, steps); NaN where not measured."""

    gc_ms: np.ndarray
    gc_count: np.ndarray
    gc_full_ms: np.ndarray
    gc_full_count: np.ndarray
    gc_steps: np.ndarray
    gc_step_ms: np.ndarray

    def matrix(self) -> np.ndarray:
        """(ranks, len(GC_FIELDS)) float64, columns in GC_FIELDS order."""
        return np.column_stack([getattr(self, name) for name in GC_FIELDS])

    def masked(self, ranks: np.ndarray) -> "GcPauseRows":
        """A copy with NaN in the rows where `ranks` (bool, (ranks,)) is True."""
        return GcPauseRows(*(np.where(ranks, np.nan, getattr(self, name)) for name in GC_FIELDS))


@dataclass(frozen=True)
class Gathered:
    """All ranks' rows of one sampled step, unpacked: (ranks,) or (ranks, stages) arrays,
    comparable_ms (ranks, MAX_COMPARABLE) with comparable_count valid entries per rank,
    groups (ranks,) int64 comparison group ids, -1 where a rank gave none, forward_passes
    (ranks,) float64, NaN where not counted, run_queue_ms (ranks,) float64, NaN where not
    measured, gc the garbage-collection pauses (None only where built without rows), stack
    the sampled-stack segments."""

    steps: np.ndarray
    tokens: np.ndarray
    device_ms: np.ndarray
    host_ms: np.ndarray
    waited_ms: np.ndarray
    calls: np.ndarray
    comparable_count: np.ndarray
    comparable_ms: np.ndarray
    groups: np.ndarray
    forward_passes: np.ndarray
    run_queue_ms: np.ndarray
    kernel: Optional[KernelMatrix] = None
    gc: Optional[GcPauseRows] = None
    stack: Optional[np.ndarray] = None  # (ranks, STACK_LEN) sampled-stack segments, NaN where none travelled

    @property
    def num_ranks(self) -> int:
        return int(self.steps.shape[0])


def unpack(rows: np.ndarray) -> Gathered:
    """rows: (ranks, ROW_LEN) float64. Raises ValueError on a wrong shape."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != ROW_LEN:
        raise ValueError(f"payload rows must have shape (ranks, {ROW_LEN}), got {rows.shape}")
    body = rows[:, _H:_H + _BODY].reshape(rows.shape[0], len(STAGES), len(FIELDS))
    kernel = rows[:, _KERNEL_AT:_STACK_AT].reshape(rows.shape[0], len(STAGES), len(KERNEL_FIELDS))
    return Gathered(
        steps=rows[:, 0].copy(),
        tokens=rows[:, 1].copy(),
        device_ms=body[:, :, 0].copy(),
        host_ms=body[:, :, 1].copy(),
        waited_ms=body[:, :, 2].copy(),
        calls=body[:, :, 3].copy(),
        comparable_count=rows[:, 3].astype(np.int64),
        comparable_ms=rows[:, _H + _BODY:_KERNEL_AT].copy(),
        groups=np.nan_to_num(rows[:, HEADER.index("group")], nan=-1.0).astype(np.int64),
        forward_passes=rows[:, HEADER.index("forward_passes")].copy(),
        run_queue_ms=rows[:, HEADER.index("run_queue_ms")].copy(),
        kernel=KernelMatrix(kernel[:, :, 0].copy(), kernel[:, :, 1].copy(), kernel[:, :, 2].copy()),
        gc=GcPauseRows(*(rows[:, HEADER.index(name)].copy() for name in GC_FIELDS)),
        stack=rows[:, _STACK_AT:].copy(),
    )


def row_from_sample(sample, tokens: float, rank: int, group: Optional[int] = None,
                    forward_passes: float = np.nan, kernel: Optional[np.ndarray] = None,
                    run_queue_ms: float = np.nan, gc: Optional[Sequence[float]] = None,
                    stack: Optional[np.ndarray] = None, untimed: bool = True) -> np.ndarray:
    """Packs a StageTimer StepSample (group, forward_passes, kernel, run_queue_ms, gc, stack:
    as in pack). When the collective layer timed collectives, the communication stages come
    from them: `communication` is the wall time with a collective in flight and
    `communication/<op>` the summed durations per op. The `untimed` stage is the sample's
    untimed_ms (NaN: not measured); untimed=False leaves it NaN (a rank whose collectives
    are not timed spends its waits on peers there, which would blame the waiting rank)."""
    from relax_straggler.common.stages import COMMUNICATION_OPS, stage_id

    device = np.array(sample.device_ms, dtype=np.float64)
    host = np.array(sample.host_ms, dtype=np.float64)
    waited = np.array(sample.waited_ms, dtype=np.float64)
    calls = np.array(sample.calls, dtype=np.float64)
    op_calls = sample.comm_op_calls
    if sum(op_calls) > 0:
        ops = [("communication", sample.comm_total_ms, sum(op_calls))]
        ops += [(f"communication/{op}", sample.comm_op_ms[i], op_calls[i])
                for i, op in enumerate(COMMUNICATION_OPS) if op_calls[i] > 0]
        for name, ms, n in ops:
            sid = stage_id(name)
            device[sid] = host[sid] = ms
            waited[sid] = 0.0
            calls[sid] = n
    outside = float(sample.untimed_ms) if untimed else math.nan
    if math.isfinite(outside):  # a measured stage: the timer's host time outside every section
        sid = stage_id("untimed")
        device[sid] = host[sid] = outside
        waited[sid] = 0.0
        calls[sid] = 1.0
    return pack(sample.step, tokens, rank, device, host, waited, calls, sample.comparable_ms, group, forward_passes,
                kernel, run_queue_ms, gc, stack)


# The per-op row: a second fixed-size float64 row per rank, gathered with the stage row on
# sampled steps (relax_straggler.live.op_records records it, relax_straggler.whatif.live replays it).
#   [step, rank, dp_rank, stage, num_ops, dropped_ops (this step), dropped_ops_total, t0_unix_s]
#   then max_ops x (op type index into OP_TYPES, microbatch, model chunk, start_s, duration_s)
# start_s is relative to t0_unix_s (host wall clock of the step's first recorded op), so
# ranks on one host line up to the clock's resolution; NaN fills unused op slots.
OP_HEADER = ("step", "rank", "dp_rank", "stage", "num_ops", "dropped_ops", "dropped_ops_total", "t0_unix_s")
OP_FIELDS = ("optype", "microbatch", "chunk", "start_s", "duration_s")
# Megatron timer names the recorder keeps; the combined p2p ops are split into their send and
# receive halves on the metrics rank. `optimizer` is the step's tail after the last recorded op.
OP_TYPES = ("forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send", "backward-recv",
            "forward-send-backward-recv", "backward-send-forward-recv", "all-grads-sync",
            "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer")
OP_TYPE_IDS = {name: i for i, name in enumerate(OP_TYPES)}
DEFAULT_MAX_OPS = 256  # per rank and step: 1F1B with M microbatches records about 4 M + 4


def op_row_len(max_ops: int) -> int:
    """Length of a per-op row holding max_ops ops."""
    return len(OP_HEADER) + len(OP_FIELDS) * max_ops


def pack_ops(step: int, rank: int, dp_rank: int, stage: int, dropped_ops: int, dropped_ops_total: int,
             t0_unix_s: float, ops: np.ndarray, max_ops: int) -> np.ndarray:
    """One rank's per-op row. ops: (n, len(OP_FIELDS)) float64 with n <= max_ops (start_s
    relative to t0_unix_s). Raises ValueError when ops has the wrong shape or too many rows."""
    ops = np.asarray(ops, dtype=np.float64).reshape(-1, len(OP_FIELDS))
    if len(ops) > max_ops:
        raise ValueError(f"pack_ops: {len(ops)} ops for a row of max_ops={max_ops}")
    row = np.full(op_row_len(max_ops), np.nan, dtype=np.float64)
    row[:len(OP_HEADER)] = (step, rank, dp_rank, stage, len(ops), dropped_ops, dropped_ops_total, t0_unix_s)
    row[len(OP_HEADER):len(OP_HEADER) + ops.size] = ops.ravel()
    return row


@dataclass(frozen=True)
class GatheredOps:
    """All ranks' per-op rows of one sampled step: header columns (ranks,) and ops
    (ranks, max_ops, len(OP_FIELDS)), the first num_ops of each rank valid."""

    steps: np.ndarray
    ranks: np.ndarray
    dp_ranks: np.ndarray
    stages: np.ndarray
    num_ops: np.ndarray
    dropped_ops: np.ndarray  # in this step
    dropped_ops_total: np.ndarray  # lifetime
    t0_unix_s: np.ndarray
    ops: np.ndarray


def unpack_ops(rows: np.ndarray) -> GatheredOps:
    """rows: (ranks, op_row_len(max_ops)) float64. Raises ValueError on a shape that is no
    op row, or a rank whose num_ops is not an integer in [0, max_ops]."""
    rows = np.asarray(rows, dtype=np.float64)
    h, f = len(OP_HEADER), len(OP_FIELDS)
    if rows.ndim != 2 or rows.shape[1] < h or (rows.shape[1] - h) % f:
        raise ValueError(f"per-op rows must have shape (ranks, {h} + {f} x max_ops), got {rows.shape}")
    max_ops = (rows.shape[1] - h) // f
    num = rows[:, OP_HEADER.index("num_ops")]
    bad = ~np.isfinite(num) | (num < 0) | (num > max_ops) | (num != np.round(num))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"per-op row of rank index {i}: num_ops {num[i]} is not an integer in [0, {max_ops}]")

    def col(name: str) -> np.ndarray:
        return rows[:, OP_HEADER.index(name)].copy()

    return GatheredOps(steps=col("step"), ranks=col("rank"), dp_ranks=col("dp_rank"), stages=col("stage"),
                       num_ops=num.astype(np.int64), dropped_ops=col("dropped_ops"),
                       dropped_ops_total=col("dropped_ops_total"), t0_unix_s=col("t0_unix_s"),
                       ops=rows[:, h:].reshape(rows.shape[0], max_ops, f).copy())

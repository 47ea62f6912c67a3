"""What the live what-if adds per sampled step: recording ops, packing the per-op row, the
larger gather, and the replay on the metrics rank.

    torchrun --standalone --nproc-per-node 2 benchmarks/whatif_live_cost.py [--repeats 15]

Training thread (ns):
  op, non-sampled step     OpRecorder.start + stop of one op when the step is not sampled
                           (the stage timer's `sampled` flag, read through the binding)
  op, sampled step         the same on a sampled step (two host-clock reads, one buffer row)
  take_row, N ops          the step's per-op row with N ops recorded (N = 28: 1F1B, 6
                           microbatches; N = 255: a full default buffer)
  gather, stage row        launch-to-arrival on the metrics rank of the stage row alone
  gather, + per-op row     the same with the per-op row appended (DEFAULT_MAX_OPS slots)
Metrics rank, report thread (ms): LiveWhatIf.metrics (rows -> records -> engine model ->
S, S_dp, S_stage, S_optype, M_W, M_S, one thread) on per-op rows of a synthetic 1F1B step
(the engine's synthetic job, its recorded timeline packed as live rows): the test's size
(pp 2, 6 microbatches) and larger ones.

Each figure is the median over --repeats (of the mean over --number calls for the per-op
costs). Rank 0 prints; every rank runs the gathers (they are collective).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch.distributed as dist

from relax_straggler._ext import core, ext
from relax_straggler.common.payload import DEFAULT_MAX_OPS, OP_FIELDS, OP_TYPE_IDS, ROW_LEN, pack_ops
from relax_straggler.common.stages import STAGES
from relax_straggler.live.aggregation import LocalGather, SideGroupGather
from relax_straggler.live.op_records import OpRecorder
from relax_straggler.whatif.live import LiveWhatIf

# The engine's synthetic op types (csrc/core/whatif/synthetic.cpp, kSyntheticOpTypes) -> the
# live vocabulary; the ones the live recorder does not keep are left out of the rows.
_SYNTHETIC = ("forward-compute", "backward-compute", "forward-send", "forward-recv", "backward-send", "backward-recv",
              None, "all-grads-sync", None, "embedding-grads-all-reduce", "optimizer-clip-main-grad", "optimizer", None)


def per_call_ns(fn, number: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter_ns() - t0) / number)
    return statistics.median(runs)


def recording(repeats: int) -> dict[str, float]:
    timer = ext().StageTimer(len(STAGES), 2, 0, 4096, False)
    ops = OpRecorder(timer, rank=0)
    code = OP_TYPE_IDS["forward-compute"]

    def pair() -> None:
        ops.start(code, numbered=True)
        ops.stop(code)

    out = {}
    timer.begin_step(1)  # not sampled (interval 2)
    out["op, non-sampled step (ns)"] = per_call_ns(pair, 20000, repeats)
    timer.begin_step(2)
    batch, runs = 200, []  # within the buffer: the cost of a recorded op, not of a dropped one
    for _ in range(repeats * 20):
        t0 = time.perf_counter_ns()
        for _ in range(batch):
            pair()
        runs.append((time.perf_counter_ns() - t0) / batch)
        ops.take_row(2)
    out["op, sampled step (ns)"] = statistics.median(runs)
    for n in (28, DEFAULT_MAX_OPS - 1):
        runs = []
        for _ in range(repeats * 20):
            for _ in range(n):
                pair()
            t0 = time.perf_counter_ns()
            ops.take_row(2)
            runs.append(time.perf_counter_ns() - t0)
        out[f"take_row, {n} ops (ns)"] = statistics.median(runs)
    return out


def gathers(repeats: int) -> dict[str, float]:
    distributed = dist.is_initialized()
    gather = SideGroupGather(list(range(dist.get_world_size())), 0) if distributed else LocalGather()
    row = np.zeros(ROW_LEN)
    op_row = pack_ops(0, gather.rank, gather.rank, 0, 0, 0, 0.0, np.zeros((28, len(OP_FIELDS))), DEFAULT_MAX_OPS)
    out = {}
    for label, extra in (("gather, stage row (us)", None), ("gather, + per-op row (us)", op_row)):
        times = []
        for _ in range(repeats * 20):
            if distributed:
                dist.barrier(group=gather.group)  # every rank launches together: the figure is the transfer
            t0 = time.perf_counter_ns()
            pending = gather.gather(row, extra)
            if pending is not None:
                pending.wait()
            times.append((time.perf_counter_ns() - t0) / 1e3)
        out[label] = statistics.median(times)
    gather.close()
    return out


def synthetic_rows(dp: int, pp: int, microbatches: int, slow_factor: float = 1.5) -> np.ndarray:
    """Per-op rows of one synthetic 1F1B step, worker (dp 0, last stage) slow_factor x slower."""
    wi = core().whatif
    model = wi.synthetic_model(dp, pp, microbatches, 1, seed=0, slow_dp=0, slow_stage=pp - 1, slow_factor=slow_factor)
    start, end = model.timeline(False)
    slot_stage, slot_type = np.array(model.slot_stage), np.array(model.slot_optype)
    slots = len(slot_stage)
    start, end = start.reshape(slots, dp), end.reshape(slots, dp)
    keep = np.array([_SYNTHETIC[t] is not None for t in slot_type])
    rows = []
    for lane in range(dp):
        for stage in range(pp):
            mine = np.flatnonzero(keep & (slot_stage == stage))
            mine = mine[np.argsort(start[mine, lane], kind="stable")]
            t0 = float(start[mine, lane].min())
            ops = np.array([(OP_TYPE_IDS[_SYNTHETIC[slot_type[s]]], -1, -1, start[s, lane] - t0,
                             end[s, lane] - start[s, lane]) for s in mine])
            rows.append(pack_ops(0, lane * pp + stage, lane, stage, 0, 0, 1.0e9 + t0, ops, DEFAULT_MAX_OPS))
    return np.stack(rows)


def replays(repeats: int, sizes: list[tuple[int, int, int]]) -> dict[str, float]:
    out = {}
    for dp, pp, mb in sizes:
        rows = synthetic_rows(dp, pp, mb)
        live = LiveWhatIf()
        metrics = live.metrics(rows)
        assert metrics["straggler/whatif/leader"] == f"dp 0 / pp {pp - 1}", metrics
        runs = []
        for _ in range(max(3, repeats // (1 + dp * pp // 64))):
            t0 = time.perf_counter()
            live.metrics(rows)
            runs.append((time.perf_counter() - t0) * 1e3)
        ops = int(np.nansum(rows[:, 4]))
        out[f"replay, dp {dp} x pp {pp}, {mb} microbatches, {ops} ops (ms)"] = statistics.median(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    distributed = "WORLD_SIZE" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    results = {**recording(args.repeats), **gathers(args.repeats)}
    if not distributed or dist.get_rank() == 0:
        results.update(replays(args.repeats, [(1, 2, 6), (8, 8, 32), (64, 16, 32)]))
        width = max(map(len, results))
        for name, value in results.items():
            print(f"{name:<{width}}  {value:12.2f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Host cost the collective layer adds to one collective on a non-sampled step.

    python benchmarks/collective_cost.py [--blocks 40] [--calls 2000]

One process, a Gloo group of size 1, 4-float all-reduces (the smallest real collective).
Blocks of calls alternate between the plain backend and the wrapped one (step not
sampled, so the wrapper forwards after one branch) and, for reference, the wrapped one
on a sampled step. Reports per-call medians over blocks and the median paired difference
with its interquartile range, and, on its own, what the per-group progress counters (kept
on every op, sampled or not) cost per op: GroupProgress.enter in a loop of 10^7 calls,
median of --blocks runs.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler._ext import ext
from relax_straggler.common.stages import STAGES


def per_call_ns(calls: int, x: torch.Tensor) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        dist.all_reduce(x)
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--output", type=str, default="runs/collective_cost.json")
    args = p.parse_args()
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    pg, C = dist.group.WORLD, ext()
    x = torch.ones(4)
    timer = C.StageTimer(len(STAGES), 1_000_000_000, max_events=1 << 16)
    per_call_ns(args.calls, x)  # warm-up
    plain, wrapped, sampled = [], [], []
    for _ in range(args.blocks):
        plain.append(per_call_ns(args.calls, x))
        C.wrap_process_group(pg, "cpu", timer, True)
        timer.begin_step(1)  # not sampled
        wrapped.append(per_call_ns(args.calls, x))
        timer.begin_step(0)  # sampled: every call recorded (pool sized for a block)
        sampled.append(per_call_ns(min(args.calls, 30_000), x))
        timer.end_step()
        C.unwrap_process_group(pg, "cpu")
    progress = [C.progress_cost_ns(10_000_000) for _ in range(args.blocks)]
    diff = np.array(wrapped) - np.array(plain)
    q1, med, q3 = np.percentile(diff, [25, 50, 75])
    result = {"plain_ns": float(np.median(plain)), "wrapped_ns": float(np.median(wrapped)),
              "sampled_ns": float(np.median(sampled)), "overhead_ns": float(med), "overhead_iqr_ns": [q1, q3],
              "progress_ns": float(np.median(progress)), "progress_range_ns": [min(progress), max(progress)],
              "blocks": args.blocks, "calls": args.calls}
    print(f"plain all_reduce           {result['plain_ns']:10.0f} ns/call")
    print(f"wrapped, not sampled       {result['wrapped_ns']:10.0f} ns/call")
    print(f"wrapped, sampled           {result['sampled_ns']:10.0f} ns/call")
    print(f"wrapper cost, not sampled  {med:10.0f} ns/call  (IQR {q1:.0f} .. {q3:.0f})")
    print(f"progress counters          {result['progress_ns']:10.1f} ns/op    "
          f"(range {min(progress):.1f} .. {max(progress):.1f})")
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w") as fh:
        json.dump(result, fh, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Worker for test_kernel_evidence_multirank: two Gloo ranks time manual forward and
backward sections; from step SLOW_FROM on rank 1's forward takes longer, and a synthetic
kernel source says why: its kernels ran longer (`device`) or its stream sat idle (`host`).
The metrics rank writes {"reports": every report's metrics, "step_s": every rank's step times}.
Usage (under torchrun): kernel_evidence.py OUTPUT_JSON MODE STEPS"""

import json
import sys
import time

import torch.distributed as dist

from relax_straggler import StragglerConfig
from relax_straggler.live.kernel_evidence import SyntheticKernelSource
import relax_straggler
from step_times import StepClock  # beside this file

MS = 1_000_000  # ns
SLOW_FROM = 4
FAST_MS, SLOW_MS, BACKWARD_MS = 5, 45, 5


def plan(rank: int, mode: str):
    """Records and sections of rank `rank`'s sampled steps: a forward section as long as the
    rank sleeps in it, 80 % kernels on a healthy rank; the slow rank's extra time is kernels
    (device) or idle stream (host)."""

    def step_records(step: int):
        slow = rank == 1 and step >= SLOW_FROM
        length = (SLOW_MS if slow else FAST_MS) * MS
        busy = 4 * MS
        if slow and mode == "device":
            busy = length - MS
        t0 = (step + 1) * 1_000 * MS
        records = [("kernel", t0, t0 + busy, 0, "_Z4gemmv")]
        return records, [("forward", 0, t0, t0 + length)]

    return step_records


def main() -> None:
    out, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=0, hang_seconds=0.0, window_every=0,
                             collective_timing=False, kernel_stats=True)
    reports = []
    analyzer = relax_straggler.install(None, config=config, report_fn=lambda m, s, details: reports.append(dict(m, **details, step=s)),
                                       kernel_source=SyntheticKernelSource(plan(rank, mode)))
    clock = StepClock()
    for step in range(steps):
        with clock:
            with analyzer.section("forward"):
                time.sleep((SLOW_MS if rank == 1 and step >= SLOW_FROM else FAST_MS) / 1000)
            with analyzer.section("backward"):
                time.sleep(BACKWARD_MS / 1000)
            analyzer.step()
            dist.barrier()  # the lockstep a training collective gives
    analyzer.uninstall()
    step_s: list = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"reports": reports, "step_s": step_s}, fh, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

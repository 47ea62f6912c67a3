"""Worker for test_multirank: every rank gathers a known synthetic row over the side
group; the metrics rank judges it and compares with the core called on the same matrix.
Rank 0 writes {"results": per step, "launch_s": every rank's gather() call times}.
Usage (under torchrun): aggregate.py OUTPUT_JSON STEPS"""

import json
import sys

import numpy as np
import torch.distributed as dist

from relax_straggler import StragglerConfig
from relax_straggler._ext import core
from relax_straggler.common.payload import pack, unpack
from relax_straggler.common.stages import STAGES
from relax_straggler.judge.report import build_report, verdict_config
from relax_straggler.live.aggregation import SideGroupGather
from step_times import StepClock  # beside this file


def synthetic(step: int, rank: int) -> np.ndarray:
    """Deterministic (stages,) ms for (step, rank); rank step % world is slow in backward."""
    rng = np.random.default_rng(1000 * step + rank)
    ms = rng.normal(40.0, 1.0, len(STAGES))
    ms[5:] = np.nan  # module and per-op stages not run
    if rank == step % dist.get_world_size():
        ms[1] *= 1.6
    return ms


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = StragglerConfig(enabled=True)
    gather = SideGroupGather(list(range(world)), metrics_rank=0)
    results = []
    clock = StepClock()  # the time each gather() call takes: launching never waits
    for step in range(steps):
        ms = synthetic(step, rank)
        with clock:
            pending = gather.gather(pack(step, float("nan"), rank, ms, ms, np.zeros(len(STAGES)),
                                         np.ones(len(STAGES))), step=step)
        if pending is None:
            continue
        report = build_report(unpack(pending.wait()), step, config, 0, {})
        matrix = np.stack([synthetic(step, r) for r in range(world)])[:, :5]
        verdict = core().judge_step(matrix, list(STAGES[:5]), step, verdict_config(config))
        results.append({
            "step": step,
            "same_matrix": bool(np.array_equal(report.judged_ms, matrix)),
            "report": {s: [report.top_ranks[s], list(report.stragglers[s])] for s in report.stages},
            "core": {sv.stage: [sv.top_rank, list(sv.stragglers)] for sv in verdict.stages},
            "bottleneck": [report.likely_bottleneck, verdict.stages[verdict.likely_bottleneck].stage],
            "hints": [report.hints, verdict.hints],
        })
    gather.close()
    launch_s: list = [None] * world
    dist.all_gather_object(launch_s, clock.times)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"results": results, "launch_s": launch_s}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

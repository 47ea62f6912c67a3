"""Worker for test_side_tree: the analyzer installed four times in a row on the same ranks,
with the flat side channel and with the hierarchical one (nodes of 2 ranks, 2 leaders a
group at each level above them: on 8 ranks, two levels), each with metrics rank 0 and 1 (1
is no node's first rank). Each rank's measured row is replaced by a
known one of its (rank, step) (rank 3 is 50 % slower in forward), so the runs gather the
same rows and must report the same. DDP training of 5 ms steps keeps the ranks in step, as
training does.

Usage (under torchrun): side_tree.py OUT_DIR STEPS
Writes OUT_DIR/{mode}.json on that mode's metrics rank (the reports, in JSON text, as the
report callback got them) and OUT_DIR/rank{R}.json on every rank (step times, warnings,
why the analysis stopped in each mode).
"""

import json
import logging
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

from relax_straggler import StragglerConfig
from relax_straggler.common.payload import pack
from relax_straggler.common.stages import STAGE_IDS, STAGES
import relax_straggler
import relax_straggler.live.analyzer
from step_times import StepClock  # beside this file
from warnings_log import Warnings

STEP_S = 0.005
MODES = {"flat-0": (0, 0), "tree-0": (2, 0), "flat-1": (0, 1), "tree-1": (2, 1)}  # (side_node_size, metrics rank)
FANOUT = 2


def known_row(sample, tokens, rank, group=None, forward_passes=math.nan, kernel=None, run_queue_ms=math.nan, gc=None,
              stack=None, untimed=True):
    """The row of (rank, step): 5 core stages near 40 ms; rank 3 slower in forward."""
    rng = np.random.default_rng(1000 * sample.step + rank)
    ms = np.full(len(STAGES), np.nan)
    for s in ("forward", "backward", "optimizer", "communication", "data"):
        ms[STAGE_IDS[s]] = 40.0 * math.exp(0.015 * rng.standard_normal())
    if rank == 3:
        ms[STAGE_IDS["forward"]] *= 1.5
    zeros = np.where(np.isnan(ms), np.nan, 0.0)
    return pack(sample.step, tokens, rank, ms, ms, zeros, np.where(np.isnan(ms), np.nan, 1.0), (), group,
                forward_passes, run_queue_ms=float(rng.exponential(1.0)), stack=stack)


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    warnings = Warnings()
    logging.getLogger("relax_straggler").addHandler(warnings)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    relax_straggler.live.analyzer.row_from_sample = known_row
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))  # keeps the ranks in step
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mine: dict = {"step_s": {}, "stopped_by": {}, "warnings": warnings.lines}
    for mode, (node_size, metrics_rank) in MODES.items():
        reports: list[str] = []
        config = StragglerConfig(enabled=True, interval=1, warmup_steps=0, control_every=5, hang_seconds=0,
                                 side_node_size=node_size, side_fanout=FANOUT, metrics_rank=metrics_rank)
        analyzer = relax_straggler.install(
            model, opt, config=config,
            report_fn=lambda m, step, details: reports.append(json.dumps([step, {**m, **details}])))
        clock = StepClock()
        for _ in range(steps):
            with clock:
                time.sleep(STEP_S)
                loss = model(torch.randn(4, 8)).sum()
                loss.backward()
                opt.step()
                opt.zero_grad()
        analyzer.uninstall()
        stopped = analyzer.stopped_by
        mine["step_s"][mode] = clock.times
        mine["stopped_by"][mode] = None if stopped is None else stopped.describe()
        if rank == metrics_rank:
            with open(os.path.join(out, f"{mode}.json"), "w") as fh:
                json.dump(reports, fh)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump(mine, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

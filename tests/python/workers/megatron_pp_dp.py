"""Worker of test_megatron's PP 2 x DP 2 run: the real Megatron-Core 1F1B schedule on 4
Gloo ranks (stage 0: ranks 0-1, stage 1: ranks 2-3), every rank's forward sleeping BASE_S
per microbatch, rank 3 (stage 1, dp 1) twice as long from step ONSET on, with the analyzer's
default noise settings. Rank 0 writes the confirmed verdict of every report and every
rank's step times.
Usage (under torchrun, 4 ranks): megatron_pp_dp.py OUTPUT_JSON"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from megatron_worker import TinyModel, finish_pp2, grads_finalize, megatron_step, start_pp2  # beside this file
from step_times import StepClock

BASE_S = 0.020
SLOW_RANK = 3
SLOW = 2.0  # on 2 cores shared by 4 ranks and other work a stage moves by tens of ms; the
# sensitivity to +20 % is measured on a quiet machine (docs/PERFORMANCE.md)
STEPS = 40
ONSET = 16  # the 8th report at interval 2 from step 2: the noise is learned by then


def main() -> None:
    out = sys.argv[1]
    rank = start_pp2()

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_straggler import StragglerConfig
    from relax_straggler.integrations import megatron

    model = TinyModel(delay_s=BASE_S)
    # The data-parallel gradient all-reduce, within each rank's dp group.
    model.config.finalize_model_grads_func = grads_finalize(parallel_state.get_data_parallel_group)
    reports: list = []
    analysis = megatron.install(model, None, config=StragglerConfig(enabled=True, interval=2, warmup_steps=2),
                                report_fn=lambda m, s, details: reports.append((s, {k: v for k, v in {**m, **details}.items()
                                                                         if k.startswith("straggler/verdict/")})))
    fb = get_forward_backward_func()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    clock = StepClock()
    for step in range(STEPS):
        if rank == SLOW_RANK and step == ONSET:
            model.delay_s = SLOW * BASE_S
        megatron_step(analysis, fb, model, opt, rank, step, label=step, clock=clock)
    analysis.uninstall()
    step_s: list = [None] * dist.get_world_size()
    dist.all_gather_object(step_s, clock.times)
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"reports": reports, "onset": ONSET, "slow_rank": SLOW_RANK, "step_s": step_s}, fh)
    finish_pp2()


if __name__ == "__main__":
    main()

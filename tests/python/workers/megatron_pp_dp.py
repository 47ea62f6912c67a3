"""Worker of test_megatron's PP 2 x DP 2 run: the real Megatron-Core 1F1B schedule on 4
Gloo ranks (stage 0: ranks 0-1, stage 1: ranks 2-3), every rank's forward sleeping BASE_S
per microbatch, rank 3 (stage 1, dp 1) 20 % longer from step ONSET on, with the analyzer's
default noise settings. Rank 0 writes the confirmed verdict of every report.
Usage (under torchrun, 4 ranks): megatron_pp_dp.py OUTPUT_JSON"""

from __future__ import annotations

import json
import sys

import torch

from megatron_worker import (MICROBATCHES, TinyModel, batches, finish_pp2, forward_step,  # beside this file
                             grads_finalize, start_pp2)

BASE_S = 0.020
SLOW_RANK = 3
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
                                report_fn=lambda m, s: reports.append((s, {k: v for k, v in m.items()
                                                                         if k.startswith("straggler/verdict/")})))
    fb = get_forward_backward_func()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if rank == SLOW_RANK and step == ONSET:
            model.delay_s = 1.2 * BASE_S
        with analysis.train_step(step=step):
            fb(forward_step_func=forward_step, data_iterator=batches(rank, step), model=model,
               num_microbatches=MICROBATCHES, seq_length=8, micro_batch_size=2, forward_only=False)
            with analysis.section("optimizer"):
                opt.step()
            opt.zero_grad()
    analysis.uninstall()
    if rank == 0:
        with open(out, "w") as fh:
            json.dump({"reports": reports, "onset": ONSET, "slow_rank": SLOW_RANK}, fh)
    finish_pp2()


if __name__ == "__main__":
    main()

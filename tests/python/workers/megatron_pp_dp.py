"""Worker of test_megatron's PP 2 x DP 2 run: the real Megatron-Core 1F1B schedule on 4
Gloo ranks (stage 0: ranks 0-1, stage 1: ranks 2-3), every rank's forward sleeping BASE_S
per microbatch, rank 3 (stage 1, dp 1) 20 % longer from step ONSET on, with the analyzer's
default noise settings. Rank 0 writes the confirmed verdict of every report.
Usage (under torchrun, 4 ranks): megatron_pp_dp.py OUTPUT_JSON"""

from __future__ import annotations

import gc
import json
import sys

import torch
import torch.distributed as dist

from megatron_worker import (MICROBATCHES, TinyModel, batches, forward_step, grads_finalize,  # beside this file
                             megatron_on_cpu)

BASE_S = 0.020
SLOW_RANK = 3
STEPS = 40
ONSET = 16  # the 8th report at interval 2 from step 2: the noise is learned by then


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_straggler import StragglerConfig
    from relax_straggler.integrations import megatron

    megatron_on_cpu()
    parallel_state.initialize_model_parallel(1, 2)
    torch.manual_seed(0)
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
    parallel_state.destroy_model_parallel()
    gc.collect()  # the model's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

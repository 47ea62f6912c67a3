"""One run of a real Megatron-Core GPTModel, pipeline 2 x data parallel 2 on 4 Gloo CPU ranks,
watched as a user watches it: the Megatron adapter installed with the `--straggler-*` flags
parsed from the command line (relax_straggler.add_arguments / from_args), so everything not
given is the product's default (collective timing on).

Stage 0 (ranks 0, 1) holds the embedding and the first half of the layers, stage 1 (ranks
2, 3) the rest, the output layer and the loss; Megatron-Core's own 1F1B schedule drives
--microbatches microbatches per step, the gradients are all-reduced within each
data-parallel group under Megatron's `all-grads-sync` timer. With --slow-rank R, rank R's
forward sleeps --slow-ms per microbatch from step --onset on; nothing else sleeps.

Every rank writes OUT_DIR/rank{R}.json: its step times (s), the analysis' side-group
failure (null when none), the relax_straggler warnings it logged and its counters; the
metrics rank's reports are in the JSONL file given with --straggler-jsonl.
Usage (under torchrun, 4 ranks):
    megatron_gpt_run.py OUT_DIR [--steps 150] [--slow-rank R --slow-ms 30 --onset 40] --straggler-analysis ...
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

import torch
import torch.distributed as dist

import relax_straggler
from megatron_gpt import forward_step, gpt_chunk, microbatches  # beside this file
from megatron_worker import finish_pp2, grads_finalize, start_pp2
from step_times import StepClock
from warnings_log import Warnings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=128)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-ms", type=float, default=30.0)
    parser.add_argument("--onset", type=int, default=40)
    relax_straggler.add_arguments(parser)
    args = parser.parse_args()
    warnings = Warnings()
    logging.getLogger("relax_straggler").addHandler(warnings)
    rank = start_pp2()

    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from relax_straggler.integrations import megatron

    model = gpt_chunk(layers=args.layers, hidden=args.hidden, vocab=args.vocab, seq=args.seq)
    model.config.finalize_model_grads_func = grads_finalize(parallel_state.get_data_parallel_group)
    delay = [0.0]
    model.register_forward_pre_hook(lambda module, inputs: time.sleep(delay[0]) if delay[0] else None)
    analysis = megatron.install(model, None, config=relax_straggler.from_args(args))
    data = microbatches(parallel_state.get_data_parallel_rank(), args.microbatches, args.seq, args.vocab)
    fb = get_forward_backward_func()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    clock = StepClock()
    for step in range(args.steps):
        if rank == args.slow_rank and step == args.onset:
            delay[0] = args.slow_ms / 1e3
        with clock:
            with analysis.train_step(step=step):
                fb(forward_step_func=forward_step, data_iterator=iter(data), model=model,
                   num_microbatches=args.microbatches, seq_length=args.seq, micro_batch_size=2, forward_only=False)
                with analysis.section("optimizer"):
                    opt.step()
                opt.zero_grad()
    analysis.uninstall()
    analyzer = analysis.analyzer
    stopped = analyzer.stopped_by
    result = {"rank": rank, "stage": parallel_state.get_pipeline_model_parallel_rank(), "step_s": clock.times,
              "warmup": analyzer.config.warmup_steps, "failed": None if stopped is None else stopped.describe(),
              "warnings": warnings.lines, "counters": analyzer.counters()}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as fh:
        json.dump(result, fh)
    dist.barrier()
    finish_pp2()


if __name__ == "__main__":
    main()

"""A small character-level GPT trained with DDP over Gloo, with straggler analysis.

The main job of the README (`make demo`): 2 ranks on 127.0.0.1, one thread per rank
pinned to its own core, trained on the Python standard library's own source files (a
corpus every machine has). Part-way through, a CPU-bound process is pinned to rank 1's
core: the contention a throttled GPU causes, not a sleep. The analyzer reports as the
run goes, writes <output>/straggler.jsonl, and the run ends with a summary line naming
the flagged rank and stage.

    torchrun --standalone --nproc-per-node 2 examples/train_gpt.py --straggler-analysis

--inject-delay RANK:STAGE:MS[:FROM] adds a deterministic sleep inside a stage on one rank
(stages: forward, backward, optimizer, data), from step FROM on (default 0); the specs of
one rank and stage add up. --inject-jitter STAGE:MS makes every rank sleep a fresh U(0, MS) ms
in that stage each step (seeded by --seed and the rank): noise common to all ranks. For
tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

import relax_straggler
from relax_straggler.demo import (
    GPT,
    Batches,
    Contender,
    GPTConfig,
    inject_delays,
    load_corpus,
    parse_delays,
    parse_jitter,
    train_step,
)

log = logging.getLogger("train_gpt")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=240)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus-bytes", type=int, default=2_000_000)
    p.add_argument("--contend-rank", type=int, default=1, help="Rank whose core gets a CPU hog (-1: none).")
    p.add_argument("--contend-steps", type=str, default="100:240", help="FIRST:LAST step of the contention.")
    p.add_argument("--contend-procs", type=int, default=2,
                   help="Busy processes sharing the contended rank's core (it keeps about 1/(N+1) of it).")
    p.add_argument("--inject-delay", action="append", default=[], metavar="RANK:STAGE:MS[:FROM]")
    p.add_argument("--inject-jitter", action="append", default=[], metavar="STAGE:MS")
    p.add_argument("--output", type=str, default="runs/demo")
    p.add_argument("--log-every", type=int, default=20)
    relax_straggler.add_arguments(p)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    core = sorted(os.sched_getaffinity(0))[local_rank % len(os.sched_getaffinity(0))]
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    try:
        planned = [(stage, ms / 1e3, first) for r, stage, ms, first in parse_delays(args.inject_delay, world)
                   if r == rank]
        jitter = parse_jitter(args.inject_jitter)
        first, last = (int(x) for x in args.contend_steps.split(":"))
        config = relax_straggler.from_args(args)
    except ValueError as exc:
        parser.error(str(exc))

    gpt = GPT(GPTConfig(seq_len=args.seq_len, d_model=args.d_model, heads=args.heads, layers=args.layers))
    model = nn.parallel.DistributedDataParallel(gpt) if distributed else gpt
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    if config.enabled and config.jsonl_path is None:
        config = config.replace(jsonl_path=os.path.join(args.output, "straggler.jsonl"))
    analyzer = relax_straggler.install(model, optimizer, config=config)
    # s per stage; the hooks read it at each call
    delays = {stage: 0.0 for stage in [stage for stage, _, _ in planned] + [stage for stage, _ in jitter]}
    noise = np.random.default_rng([args.seed, rank])
    inject_delays(delays, model, optimizer)

    batches = Batches(load_corpus(args.corpus_bytes), args.batch_size, args.seq_len, args.seed, rank)
    contender = Contender(core, args.contend_procs) if rank == args.contend_rank else None
    losses, step_ms = [], []
    try:
        for step in range(args.steps):
            if contender is not None and step == first:
                contender.start()
            if contender is not None and step == last:
                contender.stop()
            for stage in delays:  # the specs of a stage add up, each from its first step
                delays[stage] = (sum(s for st, s, first in planned if st == stage and step >= first) +
                                 sum(noise.uniform(0.0, ms) / 1e3 for st, ms in jitter if st == stage))
            t0 = time.perf_counter()
            with analyzer.section("data"):
                x, y = batches.next()
                if "data" in delays:
                    time.sleep(delays["data"])
            analyzer.set_workload(x.numel())
            loss = train_step(model, optimizer, x, y)
            step_ms.append((time.perf_counter() - t0) * 1e3)
            losses.append(loss.item())
            if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
                log.info("step %4d  loss %.3f  step %.1f ms", step, losses[-1], step_ms[-1])
    finally:
        if contender is not None:
            contender.stop()
    analyzer.uninstall()

    every_rank = [step_ms]
    if distributed:  # each rank's step times: the analysis never holds a step on any rank
        every_rank = [None] * world
        dist.all_gather_object(every_rank, step_ms)
    if rank == 0:
        write_summary(args, analyzer, losses, every_rank, world)
    if distributed:
        gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
        dist.destroy_process_group()
    return 0


def write_summary(args: argparse.Namespace, analyzer, losses: list[float], step_ms_by_rank: list[list[float]],
                  world: int) -> None:
    os.makedirs(args.output, exist_ok=True)
    step_ms = step_ms_by_rank[0]
    warm = step_ms[min(10, len(step_ms) - 1):]
    summary = {
        "world_size": world,
        "steps": len(losses),
        "loss_first": losses[0],
        "loss_last": sum(losses[-10:]) / len(losses[-10:]),
        "median_step_ms": sorted(warm)[len(warm) // 2],
        "mean_step_ms": sum(warm) / len(warm),
        "straggler_analysis": analyzer.enabled,
        "step_ms_by_rank": step_ms_by_rank,
    }
    run_summary = analyzer.summary()
    if run_summary is not None:
        confirmed = run_summary.confirmed()
        summary["reports"] = run_summary.reports
        summary["verdict"] = {"headline": run_summary.headline(), "statuses": dict(run_summary.statuses),
                              "confirmed": [c.__dict__ for c in confirmed]}
        summary["flags"] = [f.__dict__ for f in run_summary.flags()]  # the per-step RFC flags, not findings
        summary["bottlenecks"] = run_summary.bottlenecks()  # uninstall() logged the summary lines
    log.info("loss %.3f -> %.3f, median step %.1f ms", summary["loss_first"], summary["loss_last"],
             summary["median_step_ms"])
    with open(os.path.join(args.output, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=2)


if __name__ == "__main__":
    sys.exit(main())

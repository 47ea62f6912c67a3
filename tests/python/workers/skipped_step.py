"""Worker of test_skipped_step: DDP on 3 Gloo ranks with a GradScaler; at step SKIP rank 1's
gradients overflow after the all-reduce (an inf only it sees, as a rank with its own scaler
would), so its scaler skips optimizer.step() there and its step count falls one behind its
peers'. Every step is sampled; the metrics rank writes the JSONL reports, rank 0 every
rank's step times (OUT_DIR/steps.json).
Usage (under torchrun, 3 ranks): skipped_step.py OUT_DIR"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
from relax_straggler import StragglerConfig
from gathered import write_every_rank  # beside this file
from step_times import StepClock

SKIP = 10
STEPS = 30


def main() -> None:
    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    config = StragglerConfig(enabled=True, interval=1, warmup_steps=2, jsonl_path=os.path.join(out, "straggler.jsonl"))
    analyzer = relax_straggler.install(model, opt, config=config)
    gen = torch.Generator().manual_seed(rank)
    skipped = 0
    clock = StepClock()
    for step in range(STEPS):
        with clock:
            x = torch.randint(0, 32, (4, 8), generator=gen)
            with analyzer.section("forward"):
                loss = F.cross_entropy(model(x).view(-1, 32), x.view(-1))
            time.sleep(0.005)  # a step long enough that scheduling jitter stays small beside it
            scaler.scale(loss).backward()
            if rank == 1 and step == SKIP:
                next(model.parameters()).grad[0, 0] = float("inf")
            before = scaler.get_scale()
            scaler.step(opt)
            scaler.update()
            skipped += scaler.get_scale() < before
            opt.zero_grad()
    analyzer.uninstall()
    assert skipped == (1 if rank == 1 else 0), skipped
    write_every_rank(os.path.join(out, "steps.json"), clock.times)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

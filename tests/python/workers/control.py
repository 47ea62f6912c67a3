"""Worker for test_control: DDP training whose analysis an operator pauses, resumes and
re-paces through the control file while it runs. Rank 0 plays the operator: it writes the
commands at fixed steps. Each rank records which steps were sampled and every loss.
Usage (under torchrun): control.py OUTPUT_JSON CONTROL_FILE STEPS [--unobserved]"""

import gc
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
from gathered import write_every_rank  # beside this file
from step_times import StepClock
from relax_straggler import StragglerConfig

# step -> the command rank 0 writes before that step.
COMMANDS = {12: {"enabled": False}, 40: {"enabled": True, "interval": 3}, 60: {"interval": "fast"},
            70: {"relative_threshold": 1.5}}


def main() -> None:
    out, control, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    observed = "--unobserved" not in sys.argv
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = StragglerConfig(enabled=observed, interval=2, warmup_steps=2, control_file=control, control_every=8)
    analyzer = relax_straggler.install(model, opt, config=config)
    gen = torch.Generator().manual_seed(rank)
    sampled, losses = [], []
    clock = StepClock()
    for step in range(steps):
        if rank == 0 and step in COMMANDS:
            with open(control + ".tmp", "w") as fh:
                json.dump(COMMANDS[step], fh)
            os.replace(control + ".tmp", control)
        if observed and analyzer.timer.sampled:
            sampled.append(step)
        with clock:
            x = torch.randint(0, 32, (4, 8), generator=gen)
            loss = F.cross_entropy(model(x).view(-1, 32), x.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.item().hex())
    refused = analyzer.counters()["control_refused"] if observed else 0
    analyzer.uninstall()
    write_every_rank(out, {"sampled": sampled, "losses": losses, "refused": refused, "step_s": clock.times})
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

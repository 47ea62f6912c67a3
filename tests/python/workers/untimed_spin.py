"""Worker of test_untimed: DDP on Gloo ranks; in each of PHASES rank 1 spins SPIN_MS a step in
a function of its own outside every timed section: before the forward, between forward and
backward, then after the optimizer, healthy steps between the phases. Every rank's forward
sleeps FORWARD_MS (a stage of a realistic length beside the spin). The metrics rank writes
the JSONL reports, rank 0 every rank's step times (OUT_DIR/steps.json).
Usage (under torchrun): untimed_spin.py OUT_DIR"""

import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import relax_straggler
from relax_straggler import StragglerConfig

# (where, first step, end step): 8 reports each (13 the first: its confirmation's stack
# sample arrives 16 steps after the decision asking for it, then takes 3 steps the analyzer
# does not time; 9 the last, whose spin lands in the next step), 5 healthy ones between, 7
# after.
PHASES = (("before_forward", 20, 72), ("between", 92, 124), ("after_optimizer", 144, 180))
STEPS = 208
CONTROL_EVERY = 4
INTERVAL = 4
SPIN_MS = 30.0
FORWARD_MS = 10.0
WARMUP = 4


class Sleepy(nn.Module):
    """A linear layer whose forward also sleeps FORWARD_MS."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(FORWARD_MS / 1e3)
        return self.fc(x)


def spin_outside_sections(ms: float) -> None:
    """Busy work of the rank's own, in no section."""
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


def main() -> None:
    from gathered import write_every_rank  # beside this file (the test imports PHASES from it)
    from step_times import StepClock

    out = sys.argv[1]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(Sleepy())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    config = StragglerConfig(enabled=True, interval=INTERVAL, warmup_steps=WARMUP, control_every=CONTROL_EVERY,
                             jsonl_path=os.path.join(out, "straggler.jsonl"))
    analyzer = relax_straggler.install(model, opt, config=config)
    gen = torch.Generator().manual_seed(rank)
    clock = StepClock()
    for step in range(STEPS):
        where = next((w for w, first, end in PHASES if first <= step < end), None) if rank == 1 else None
        with clock:
            x = torch.randn(8, 32, generator=gen)
            if where == "before_forward":
                spin_outside_sections(SPIN_MS)
            y = model(x)
            if where == "between":
                spin_outside_sections(SPIN_MS)
            y.pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            if where == "after_optimizer":
                spin_outside_sections(SPIN_MS)
    analyzer.uninstall()
    write_every_rank(os.path.join(out, "steps.json"), clock.times)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

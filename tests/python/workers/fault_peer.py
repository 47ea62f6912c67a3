"""Worker for test_faults: two Gloo ranks, one of which SIGKILLs or SIGSTOPs itself at a
fixed step; the other trains on and writes what it saw.

Usage (one process per rank, MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE set):
    fault_peer.py OUT_DIR MODE FAULT FAULTY_RANK STEPS [--unobserved]
MODE: ddp (one DDP model: a peer's fault is the training's own) or independent (each rank
trains its own model; only the analysis connects the ranks, as rollout workers do).
FAULT: kill or stop. The surviving rank writes OUT_DIR/rank{R}.json: outcome ("finished"
or "error"), error type, the step it failed at, steps trained, uninstall seconds, the steps
report_fn was given (metrics rank), counters; then exits as the script would without the
analyzer (1 with the training's exception, else 0).
"""

import datetime
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
import relax_straggler.aggregation
from relax_straggler import StragglerConfig

FAULT_STEP = 10
TRAINING_TIMEOUT_S = 8  # the training's own collective timeout (a stopped DDP peer fails after it)
STALL_TIMEOUT_S = 3.0   # how long a rank waits on a stuck peer's gather before giving the analysis up


def main() -> None:
    out, mode, fault, faulty, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    observed = "--unobserved" not in sys.argv
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TRAINING_TIMEOUT_S))
    rank = dist.get_rank()
    relax_straggler.aggregation.STALL_TIMEOUT_S = STALL_TIMEOUT_S
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
    if mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reported: list[int] = []
    config = StragglerConfig(enabled=observed, interval=1, warmup_steps=0, control_every=5,
                             control_file=os.path.join(out, "control.json"),
                             jsonl_path=os.path.join(out, "straggler.jsonl"))
    analyzer = relax_straggler.install(model, opt, config=config, report_fn=lambda m, step: reported.append(step))
    gen = torch.Generator().manual_seed(rank)
    result: dict = {"outcome": "finished", "error_type": None, "failed_step": None}
    step = 0
    try:
        for step in range(steps):
            if rank == faulty and step == FAULT_STEP:
                os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            with analyzer.section("data"):
                x = torch.randint(0, 32, (4, 8), generator=gen)
            loss = F.cross_entropy(model(x).view(-1, 32), x.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad()
        step = steps
    except Exception as exc:  # the training's own failure, reported as the script would see it
        result.update(outcome="error", error_type=type(exc).__name__, failed_step=step, error=str(exc)[:300])
        raise
    finally:
        t0 = time.monotonic()
        analyzer.uninstall()
        result.update(uninstall_s=time.monotonic() - t0, trained=step, reported=list(reported),
                      counters=analyzer.counters() if observed else {})
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump(result, fh)
        # Also after a failure: Gloo's workers may still hold the failed op, whose destruction
        # during interpreter shutdown aborts the process (SIGABRT) whether observed or not.
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Worker for test_faults: Gloo ranks (two; four for the hierarchical side channel), one of
which meets a fault at a fixed step; the others train on. Every rank writes what it saw.

Usage (one process per rank, MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE set):
    fault_peer.py OUT_DIR MODE FAULT FAULTY_RANK STEPS [--unobserved] [--step-ms MS] [--stall-timeout S]
                  [--node-size N] [--aligned]
MODE: ddp (one DDP model: a peer's fault is the training's own) or independent (each rank
trains its own model; only the analysis connects the ranks, as rollout workers do).
FAULT, at step FAULT_STEP of FAULTY_RANK:
  kill            SIGKILL itself
  stop            SIGSTOP itself (the test sends SIGCONT, or SIGKILL at the end)
  gather-fails    its side-group gather of that step reports a failure (the gather itself ran)
  gather-hangs    its side-group gather of that step never reports finishing
  sink-stalls     (the metrics rank) its report callback blocks SINK_STALL_S s at that step's report
Each rank sleeps --step-ms per step (0 by default). --stall-timeout: the seconds an
unfinished side-group gather is given before it counts as a failure (default STALL_TIMEOUT_S
here; the product's own is minutes). --node-size: the hierarchical side channel with nodes
of N ranks (default: the flat one). --aligned: the ranks start training together (a barrier
after install; the metrics rank's install takes longer, and four ranks on two cores drift
apart by more than the 16 steps a decision is given).
Each rank that lives writes OUT_DIR/rank{R}.json: outcome ("finished" or "error"), error
type, the step it failed at and when that step began (time.time()), steps trained,
uninstall seconds, the steps report_fn was given (metrics rank), counters, its step times
(s), why the analysis stopped on it (or null) and the relax_straggler warnings it logged;
then exits as the script would without the analyzer (1 with the training's exception,
else 0).
"""

import argparse
import datetime
import json
import logging
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from relax_straggler import StragglerConfig
import relax_straggler
import relax_straggler.live.aggregation
from step_times import StepClock  # beside this file
from warnings_log import Warnings

FAULT_STEP = 10
TRAINING_TIMEOUT_S = 8  # the training's own collective timeout (a stopped DDP peer fails after it)
STALL_TIMEOUT_S = 3.0
SINK_STALL_S = 30.0


class InjectedWork:
    """What a rank sees of a side-group gather that really ran: a failure (fails=True), or a
    work that never finishes."""

    def __init__(self, fails: bool) -> None:
        self.fails = fails

    def is_completed(self) -> bool:
        return self.fails

    def wait(self, timeout=None):
        if self.fails:
            raise RuntimeError("injected: the gather failed")
        time.sleep(timeout.total_seconds() if timeout else 3600)
        raise RuntimeError("Operation timed out!")


def inject_into_gather_of(step_of, fault_step: int, fails: bool) -> None:
    """The side-group gather launched at `fault_step` (step_of() at the call) is seen as InjectedWork."""
    real = dist.gather

    def gather(*args, **kwargs):
        work = real(*args, **kwargs)
        return InjectedWork(fails) if step_of() == fault_step else work

    dist.gather = gather


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("mode", choices=["ddp", "independent"])
    p.add_argument("fault", choices=["kill", "stop", "gather-fails", "gather-hangs", "sink-stalls"])
    p.add_argument("faulty", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("--unobserved", action="store_true")
    p.add_argument("--step-ms", type=float, default=0.0)
    p.add_argument("--stall-timeout", type=float, default=STALL_TIMEOUT_S)
    p.add_argument("--node-size", type=int, default=0)
    p.add_argument("--aligned", action="store_true")
    args = p.parse_args()
    out, fault, faulty = args.out, args.fault, args.faulty
    warnings = Warnings()
    logging.getLogger("relax_straggler").addHandler(warnings)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TRAINING_TIMEOUT_S))
    rank = dist.get_rank()
    relax_straggler.live.aggregation.STALL_TIMEOUT_S = args.stall_timeout
    torch.manual_seed(0)
    model: nn.Module = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
    if args.mode == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    reported: list[int] = []
    step = 0

    def report_fn(metrics: dict, at: int) -> None:
        reported.append(at)
        if fault == "sink-stalls" and at == FAULT_STEP:
            time.sleep(SINK_STALL_S)

    config = StragglerConfig(enabled=not args.unobserved, interval=1, warmup_steps=0, control_every=5,
                             control_file=os.path.join(out, "control.json"),
                             jsonl_path=os.path.join(out, "straggler.jsonl"), side_node_size=args.node_size)
    analyzer = relax_straggler.install(model, opt, config=config, report_fn=report_fn)
    if args.aligned:
        dist.barrier()
    if rank == faulty and fault in ("gather-fails", "gather-hangs"):
        inject_into_gather_of(lambda: step, FAULT_STEP, fails=fault == "gather-fails")
    gen = torch.Generator().manual_seed(rank)
    result: dict = {"outcome": "finished", "error_type": None, "failed_step": None}
    clock = StepClock()
    try:
        for step in range(args.steps):
            if rank == faulty and step == FAULT_STEP and fault in ("kill", "stop"):
                os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
            step_at = time.time()
            with clock:
                with analyzer.section("data"):
                    x = torch.randint(0, 32, (4, 8), generator=gen)
                time.sleep(args.step_ms / 1e3)
                loss = F.cross_entropy(model(x).view(-1, 32), x.view(-1))
                loss.backward()
                opt.step()
                opt.zero_grad()
        step = args.steps
    except Exception as exc:  # the training's own failure, reported as the script would see it
        result.update(outcome="error", error_type=type(exc).__name__, failed_step=step, failed_step_at=step_at,
                      error=str(exc)[:300])
        raise
    finally:
        t0 = time.monotonic()
        analyzer.uninstall()
        stopped = getattr(analyzer, "stopped_by", None)
        result.update(uninstall_s=time.monotonic() - t0, trained=step, reported=list(reported),
                      counters=analyzer.counters() if not args.unobserved else {}, step_s=clock.times,
                      stopped_by=None if stopped is None else [stopped.rank, stopped.code, stopped.step],
                      warnings=warnings.lines)
        with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
            json.dump(result, fh)
        # Also after a failure: Gloo's workers may still hold the failed op, whose destruction
        # during interpreter shutdown aborts the process (SIGABRT) whether observed or not.
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""Worker for test_hang (run under torchrun, Gloo). Usage: hang_stop.py STOP_RANK HOW OUT_DIR

Every step: an all_reduce on the world group, then one on this rank's pair group
("pair-0" = ranks 0,1; "pair-1" = ranks 2,3), 20 ms apart. The analyzer runs with
--straggler-hang-seconds 3, its JSONL in OUT_DIR/straggler.jsonl and its rows in the file
store OUT_DIR/store (job JOB), sampled every 2nd step.
At step STOP_STEP (sampled) the rank STOP_RANK stops after its collectives, before the
step ends: the others end the step, send their rows over the analyzer's side group (where
the metrics rank then waits for the stopped rank's row) and block in the next world
all_reduce. HOW = "sleep" (sleeps forever; its Python threads still run), "sigstop"
(the whole process stops) or "analyzer" (the rank's own analyzer holds its training
thread inside step(), as a fault of the analyzer would). It first writes "WALL_TIME PID"
to OUT_DIR/stopped. Every rank writes its step times so far to OUT_DIR/steps{RANK}.json
at STOP_STEP.
"""

import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import relax_straggler
from relax_straggler import StragglerConfig
from step_times import StepClock  # beside this file

STOP_STEP = 4
HANG_S = 3.0
JOB = "hang-test"


def main() -> None:
    stop_rank, how, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1], group_desc="pair-0"), dist.new_group([2, 3], group_desc="pair-1")]
    pair = pairs[rank // 2]
    config = StragglerConfig(enabled=True, interval=2, warmup_steps=0, hang_seconds=HANG_S, console=True,
                             jsonl_path=os.path.join(out, "straggler.jsonl"),
                             store_url=f"file://{os.path.join(out, 'store')}?job={JOB}")
    analyzer = relax_straggler.install(None, config=config)
    x = torch.ones(4)
    clock = StepClock()
    for step in range(10_000):
        with analyzer.section("forward"):
            time.sleep(0.02)
        dist.all_reduce(x)
        time.sleep(0.02)
        dist.all_reduce(x, group=pair)
        if step == STOP_STEP:
            with open(os.path.join(out, f"steps{rank}.json"), "w") as fh:
                json.dump(clock.times, fh)
        if step == STOP_STEP and rank == stop_rank:
            with open(os.path.join(out, "stopped"), "w") as fh:
                fh.write(f"{time.time()} {os.getpid()}")
            if how == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            if how == "analyzer":
                analyzer._publish = lambda *args: time.sleep(3600)  # held inside step()
            else:
                while True:
                    time.sleep(3600)
        analyzer.step()
        clock.lap()


if __name__ == "__main__":
    main()

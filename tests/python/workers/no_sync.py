"""Worker for test_no_sync: DDP training under the analyzer with every torch.distributed
collective and torch.cuda.synchronize wrapped to record calls made on the training
thread during the steps (install and uninstall excluded). Each rank writes what it saw.
Usage (under torchrun): no_sync.py OUTPUT_JSON STEPS INTERVAL"""

import functools
import gc
import sys
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
from gathered import write_every_rank  # beside this file
from step_times import StepClock
from relax_straggler import StragglerConfig

COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "gather_object",
               "irecv", "isend", "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
               "scatter", "send")


def main() -> None:
    out, steps, interval = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    analyzer = relax_straggler.install(model, opt, config=StragglerConfig(enabled=True, interval=interval,
                                                                          warmup_steps=0, control_every=5))
    training_thread = threading.get_ident()
    recording = {"on": False, "step": -1}
    collectives: list[list] = []
    syncs = [0]

    def wrap(name, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if recording["on"] and threading.get_ident() == training_thread:
                group = kwargs.get("group")
                where = "training" if group is None or group is dist.group.WORLD else "side"
                collectives.append([name, where, recording["step"]])
            return fn(*args, **kwargs)
        return wrapper

    for name in COLLECTIVES:
        setattr(dist, name, wrap(name, getattr(dist, name)))

    def count_sync(*args, **kwargs):
        syncs[0] += 1

    torch.cuda.synchronize = count_sync

    gen = torch.Generator().manual_seed(rank)
    reads = []
    clock = StepClock()
    for step in range(steps):
        before = analyzer.timer.read_points
        recording.update(on=True, step=step)
        with clock:
            with analyzer.section("data"):
                x = torch.randint(0, 32, (4, 8), generator=gen)
            F.cross_entropy(model(x).view(-1, 32), x.view(-1)).backward()
            opt.step()
            opt.zero_grad()
        recording["on"] = False
        reads.append(analyzer.timer.read_points - before)
    analyzer.uninstall()

    write_every_rank(out, {"reads_per_step": reads, "collectives": collectives, "synchronize": syncs[0],
                           "step_s": clock.times})
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

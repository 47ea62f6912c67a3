"""Worker for test_gc_pauses: DDP training under the analyzer where every rank holds a heap
of 1M small lists and rank GROWING also keeps a cache that grows by 30,000 small lists a
step inside forward (a cache that only grows): the interpreter's full collections on that
rank walk the whole heap, 100 ms and more every 10-20 steps. Each rank hands back its step
times and the collections' pause time in each step (its own callback, apart from the
analyzer's); the metrics rank writes the JSONL reports.
Usage (under torchrun): gc_pauses.py OUTPUT_JSON JSONL STEPS INTERVAL WARMUP GROWING"""

import gc
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import relax_straggler
from gathered import write_every_rank  # beside this file
from step_times import StepClock
from relax_straggler import StragglerConfig

HEAP = 1_000_000
GROWTH = 30_000


class GrowingCache(nn.Module):
    """Identity whose forward adds GROWTH small lists to a cache nothing ever frees, when on."""

    def __init__(self, on: bool) -> None:
        super().__init__()
        self.on = on
        self.cache: list[list[int]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.on:
            self.cache.extend([i] for i in range(GROWTH))
        return x


def main() -> None:
    out, jsonl, steps, interval, warmup, growing = (sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7]))
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    heap = [[i] for i in range(HEAP)]  # long-lived objects every full collection walks
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Embedding(32, 64), GrowingCache(rank == growing), nn.Linear(64, 32)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    config = StragglerConfig(enabled=True, interval=interval, warmup_steps=warmup, jsonl_path=jsonl)
    analyzer = relax_straggler.install(model, opt, config=config)
    gen = torch.Generator().manual_seed(rank)
    clock = StepClock()
    paused = [0.0]  # this step's collections, s
    began = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            paused[-1] += time.perf_counter() - began[0]

    gc.callbacks.append(on_gc)
    for _ in range(steps):
        paused.append(0.0)
        with clock:
            x = torch.randint(0, 32, (16, 32), generator=gen)
            F.cross_entropy(model(x).view(-1, 32), x.view(-1)).backward()
            opt.step()
            opt.zero_grad()
    gc.callbacks.remove(on_gc)
    analyzer.uninstall()
    write_every_rank(out, {"step_s": clock.times, "gc_s": paused[1:], "heap": len(heap)})
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""What measuring garbage-collection pauses costs a training step, in ns.

    python benchmarks/gc_cost.py [--repeats 15] [--number 20000] [--out runs/gc_cost.json]

The measurement is relax_straggler.live.gc_pauses.GcPauses, as the analyzer installs it:

  callback, per collection    gc.collect(0) of an empty young generation with the callback
                              installed minus without it: the two calls of the callback
                              (start, stop) a collection makes
  no-op callback              the same for a callback that does nothing: what the
                              interpreter spends on any gc.callbacks entry (its info dict
                              and the calls), apart from the callback's own body
  mark + take, sampled step   GcPauses.mark() when a sampled step begins and take() when it
                              ends (the row's GC fields)
  collections per step        what the callback counted over --steps steps of two loops: a
                              minimal training step (Linear(64, 64), SGD, batch 32) and the
                              allocation-heavy step of the GC test (30,000 small lists kept
                              a step, on a heap of 1M)
  per step, non-sampled       collections per step x the callback's cost per collection
  per step, sampled           the same plus mark + take
  growing step, with / without  median wall time of the allocation-heavy step with the
                              callback installed and without (interleaved blocks): the
                              end-to-end check of the estimate, within the machine's noise

Each figure is the median over --repeats (of the mean over --number calls where the cost is
per call).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path

import torch

from relax_straggler.live.gc_pauses import GcPauses

GROWTH = 30_000
HEAP = 1_000_000


def per_call_ns(fn, number: int, repeats: int) -> float:
    """Median over `repeats` of the mean ns of `number` calls of fn()."""
    means = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        for _ in range(number):
            fn()
        means.append((time.perf_counter_ns() - t) / number)
    return statistics.median(means)


def callback_ns(number: int, repeats: int) -> tuple[float, float, float]:
    """(ns of gc.collect(0) without a callback, ns per collection of the GcPauses callback,
    of a no-op callback)."""
    pauses = GcPauses()

    def noop(phase: str, info: dict) -> None:
        pass

    bare, ours, empty = [], [], []
    for _ in range(repeats):  # interleaved, so a load change hits all alike
        bare.append(per_call_ns(lambda: gc.collect(0), number, 1))
        pauses.install()
        try:
            ours.append(per_call_ns(lambda: gc.collect(0), number, 1))
        finally:
            pauses.remove()
        gc.callbacks.append(noop)
        try:
            empty.append(per_call_ns(lambda: gc.collect(0), number, 1))
        finally:
            gc.callbacks.remove(noop)
    base = statistics.median(bare)
    return base, statistics.median(ours) - base, statistics.median(empty) - base


def mark_take_ns(number: int, repeats: int) -> float:
    pauses = GcPauses()
    pauses.install()
    step = [0]

    def sampled_step() -> None:
        step[0] += 1
        pauses.mark(step[0])
        pauses.take(step[0])

    try:
        return per_call_ns(sampled_step, number, repeats)
    finally:
        pauses.remove()


def collections_per_step(step_fn, steps: int) -> float:
    pauses = GcPauses()
    pauses.install()
    try:
        before = pauses.totals()[1]
        for _ in range(steps):
            step_fn()
        return (pauses.totals()[1] - before) / steps
    finally:
        pauses.remove()


def training_step_fn():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    return step


def growing_step_fn():
    cache: list[list[int]] = []

    def step() -> None:
        cache.extend([i] for i in range(GROWTH))

    return step


def growing_with_without_ms(steps: int, repeats: int) -> tuple[float, float]:
    """Median wall ms of the allocation-heavy step without and with the callback."""
    pauses = GcPauses()
    times: dict[bool, list[float]] = {False: [], True: []}
    for k in range(repeats):
        for on in ((False, True) if k % 2 else (True, False)):  # either first in turn
            step = growing_step_fn()  # a fresh cache each block: the same heap for both
            if on:
                pauses.install()
            try:
                for _ in range(steps):
                    t = time.perf_counter_ns()
                    step()
                    times[on].append((time.perf_counter_ns() - t) / 1e6)
            finally:
                pauses.remove()
            del step
            gc.collect()
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    heap = [[i] for i in range(HEAP)]  # the GC test's heap: young collections stay young
    gc.collect()
    collect0, per_collection, noop = callback_ns(args.number, args.repeats)
    sampled_extra = mark_take_ns(args.number // 10, args.repeats)
    train = collections_per_step(training_step_fn(), args.steps * 10)
    growing = collections_per_step(growing_step_fn(), args.steps)
    without, with_cb = growing_with_without_ms(args.steps, max(args.repeats // 3, 3))
    result = {
        "gc_collect0_ns": collect0,
        "callback_per_collection_ns": per_collection,
        "noop_callback_per_collection_ns": noop,
        "mark_take_per_sampled_step_ns": sampled_extra,
        "collections_per_step": {"training_step": train, "growing_step": growing},
        "per_step_non_sampled_ns": {"training_step": train * per_collection, "growing_step": growing * per_collection},
        "per_step_sampled_ns": {"training_step": train * per_collection + sampled_extra,
                                "growing_step": growing * per_collection + sampled_extra},
        "growing_step_ms": {"without": without, "with": with_cb},
        "heap_objects": len(heap),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

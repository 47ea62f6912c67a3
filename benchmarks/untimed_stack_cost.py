"""What measuring time outside sections and sampling a confirmed rank's stack cost.

    python benchmarks/untimed_stack_cost.py [--repeats 15]

Training thread, stage timer (csrc/torch/stage_timer.cpp):
  step, not sampled        begin_step + 6 section enter/exit pairs + end_step of a step the
                           timer does not sample (the untimed measurement adds nothing but
                           a branch in begin_step)
  step, sampled            the same on a sampled step: its end_step also takes the step's
                           host time less the union of its 6 sections and 2 collectives
  Run it against a build without the measurement (PYTHONPATH at such a checkout) for the
  difference: the figures are absolute.
Stack sampler (relax_straggler/live/stack_sampler.py), armed only on a rank the metrics rank named:
  one sample               sys._current_frames() and the walk to the user's frame, on the
                           sampler thread, with the training thread 40 frames deep
  training step, sampled   a ~20 ms CPU-bound Python step of the training thread while the
                           sampler takes its SAMPLES samples of it, minus the unsampled step
                           just before it (median and quartiles over --pairs pairs): the
                           interpreter lock handed to the sampler, what training pays
Prints one JSON object (ns or us as named).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time

from relax_straggler._ext import ext
from relax_straggler.common.stages import STAGES


def timer_step_ns(sampled: bool, number: int) -> float:
    """Mean ns of one step: begin_step, 6 sections, 2 collectives when sampled, end_step."""
    C = ext()
    t = C.StageTimer(len(STAGES), 1 if sampled else 2, 0, 1024, False)
    step = 0 if sampled else 1
    op = C.CommOp.ALLREDUCE
    began = time.perf_counter_ns()
    for _ in range(number):
        t.begin_step(step)
        for s in range(6):
            t.start(s)
            t.stop(s)
        if sampled:
            for _ in range(2):
                t.comm_end(t.comm_begin(op, True, 8))
        t.end_step()
    return (time.perf_counter_ns() - began) / number


def deep(n: int, fn):
    return fn() if n == 0 else deep(n - 1, fn)


def one_sample_ns(number: int) -> float:
    """Mean ns of one sample of a thread 40 frames deep, taken from this thread."""
    from relax_straggler.live.stack_sampler import user_frame

    ready, done = threading.Event(), threading.Event()
    holder = {}

    def parked():
        holder["ident"] = threading.get_ident()
        ready.set()
        done.wait()

    t = threading.Thread(target=lambda: deep(40, parked))
    t.start()
    ready.wait()
    began = time.perf_counter_ns()
    for _ in range(number):
        frame = sys._current_frames()[holder["ident"]]
        user_frame(frame)
        del frame
    took = (time.perf_counter_ns() - began) / number
    done.set()
    t.join()
    return took


def work_step(iterations: int) -> float:
    """A fixed amount of CPU-bound Python work; its wall time, s."""
    began = time.perf_counter()
    x = 0
    for i in range(iterations):
        x += i * i
    return time.perf_counter() - began


def sampled_step_cost_us(repeats: int) -> dict:
    from relax_straggler.live.stack_sampler import SAMPLES, StackSampler

    iterations = 1
    while work_step(iterations) < 0.02:
        iterations *= 2
    sampler = StackSampler(steps=10**9)  # armed throughout
    sampler.arm()
    plain, extra = [], []
    for _ in range(repeats):
        plain.append(work_step(iterations))
        sampler.step_began(plain[-1])
        extra.append(work_step(iterations) - plain[-1])
        time.sleep(0.005)  # the sampler's last samples of the step
    sampler.close()
    q1, median, q3 = statistics.quantiles(extra, n=4)
    return {"step_ms": round(statistics.median(plain) * 1e3, 2), "samples_per_step": SAMPLES, "pairs": repeats,
            "extra_us_median": round(median * 1e6, 1), "extra_us_quartiles": [round(q1 * 1e6, 1), round(q3 * 1e6, 1)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--number", type=int, default=20000)
    ap.add_argument("--pairs", type=int, default=100)
    args = ap.parse_args()
    out = {
        "timer_step_not_sampled_ns": round(statistics.median(timer_step_ns(False, args.number)
                                                             for _ in range(args.repeats))),
        "timer_step_sampled_ns": round(statistics.median(timer_step_ns(True, args.number // 10)
                                                         for _ in range(args.repeats))),
    }
    try:
        out["stack_one_sample_ns"] = round(statistics.median(one_sample_ns(2000) for _ in range(args.repeats)))
        out["stack_training_step"] = sampled_step_cost_us(args.pairs)
    except ImportError:  # a checkout without the stack sampler
        pass
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""Where relax_straggler's cost goes: per-section, per-step and per-report costs, in ns.

    torchrun --standalone --nproc-per-node 2 benchmarks/section_cost.py [--repeats 15]

Training thread:
  section, disabled           `with analyzer.section(...)` of a NullAnalyzer (a shared nullcontext)
  section, non-sampled step   enter + exit of a timer Section when the step is not sampled
  section, sampled step       the same on a sampled step (two host-clock events)
  hooks, non-sampled step     forward / backward / optimizer hooks and the step end of one
                              non-sampled step: a minimal training step (Linear(16, 16),
                              SGD) with the analyzer minus the same step without it
                              (medians of individually timed steps)
  hooks, sampled step         the same for a sampled step: sections, end-of-step read,
                              pack, gather launch, queueing the report
  all-in mean per step        mean step time with the analyzer minus without, at interval
                              --interval: also what the report thread takes from the next
                              steps (it shares the GIL and, here, the core)
  end-of-step read            StageTimer.end_step() of a sampled step with 6 sections
  pack                        the fixed-size float64 row
  gather launch               the async gather on the side Gloo group (launch only)
Metrics rank, report thread:
  verdict                     judge_step through the binding, world ranks x 16 stages
  report                      build_report (verdict included) and the run-summary and
                              JSONL sinks, per sampled step

Each figure is the median over --repeats (of the mean over --number calls for the
section costs). The estimate at the end combines them into the overhead at interval k for
a step of --step-ms: training thread ((k - 1) x non-sampled + sampled) / k, and an upper
bound that adds one report per sample as if the report thread ran serialized with
training (it mostly does not: the verdict releases the GIL, and a GPU job's host waits).
Rank 0 prints; every rank runs every measurement (install and gathers are collective).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from relax_straggler import StragglerConfig
from relax_straggler._ext import core, ext
from relax_straggler.common.payload import row_from_sample, unpack
from relax_straggler.common.stages import STAGES, stage_id
from relax_straggler.judge.report import build_report, verdict_config
from relax_straggler.live.aggregation import LocalGather, SideGroupGather
from relax_straggler.reporters import JsonlSink, RunSummary
import relax_straggler

C = ext()
NEVER = 2**62  # a warm-up no step reaches: never sampled
# The sections of a demo step with module stages (one pair each).
STEP_SECTIONS = tuple(stage_id(s) for s in ("data", "forward", "attention", "backward", "communication", "optimizer"))


def per_call_ns(fn: Callable[[], None], number: int, repeats: int) -> float:
    """Median over `repeats` of the mean ns of one fn() call over `number` calls."""
    means = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        means.append((time.perf_counter_ns() - t0) / number)
    return statistics.median(means)


def section_costs(number: int, repeats: int) -> dict[str, float]:
    """ns per `with section:` enter + exit: disabled, non-sampled and sampled step."""
    null = relax_straggler.NullAnalyzer().section("data")
    timer = C.StageTimer(len(STAGES), 1, 0, 4096, False)
    sec = timer.section(stage_id("data"))

    def enter_exit(s) -> Callable[[], None]:
        def run() -> None:
            with s:
                pass
        return run

    out = {"section, disabled": per_call_ns(enter_exit(null), number, repeats)}
    not_sampled = C.StageTimer(len(STAGES), 2, 0, 4096, False)
    not_sampled.begin_step(1)
    out["section, non-sampled step"] = per_call_ns(enter_exit(not_sampled.section(stage_id("data"))), number, repeats)

    # Sampled: 1,000 sections per step (the pool holds 2,048), the step end outside the clock.
    means = []
    for _ in range(repeats):
        total = 0
        for step in range(max(1, number // 1000)):
            timer.begin_step(step)
            t0 = time.perf_counter_ns()
            for _ in range(1000):
                with sec:
                    pass
            total += time.perf_counter_ns() - t0
            timer.end_step()
        means.append(total / (max(1, number // 1000) * 1000))
    out["section, sampled step"] = statistics.median(means)
    return out


def read_cost(repeats: int) -> float:
    """Median ns of StageTimer.end_step() of a sampled step holding STEP_SECTIONS."""
    timer = C.StageTimer(len(STAGES), 1, 0, 4096, False)
    samples = []
    for _ in range(repeats * 200):
        timer.begin_step(0)
        for s in STEP_SECTIONS:
            timer.start(s)
            timer.stop(s)
        t0 = time.perf_counter_ns()
        timer.end_step()
        samples.append(time.perf_counter_ns() - t0)
    return float(np.median(samples))


def step_costs(steps: int, repeats: int, interval: int) -> dict[str, float]:
    """Per-step hook cost from interleaved blocks of minimal steps, bare and with the
    analyzer sampling every `interval`-th step: each step is timed alone, and the medians
    of sampled and non-sampled steps are compared with the median bare step. The mean
    over a whole block also counts what lands on later steps (the report thread)."""
    torch.manual_seed(0)
    model = nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(4, 16)

    def block(enabled: bool) -> np.ndarray:
        config = StragglerConfig(enabled=True, interval=interval, warmup_steps=0)
        analyzer = relax_straggler.install(model, opt, config=config) if enabled else relax_straggler.NullAnalyzer()
        data = analyzer.section("data")
        ns = np.empty(steps)
        for i in range(steps):
            t0 = time.perf_counter_ns()
            with data:
                pass
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            ns[i] = time.perf_counter_ns() - t0
        analyzer.uninstall()
        return ns

    non, sampled, mean_extra, bare_med = [], [], [], []
    sampled_mask = np.arange(steps) % interval == 0
    for r in range(repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        blocks = {enabled: block(enabled) for enabled in order}
        base = float(np.median(blocks[False]))
        bare_med.append(base)
        non.append(float(np.median(blocks[True][~sampled_mask])) - base)
        sampled.append(float(np.median(blocks[True][sampled_mask])) - base)
        mean_extra.append(float(blocks[True].mean() - blocks[False].mean()))
    return {
        "minimal step, bare": statistics.median(bare_med),
        "hooks, non-sampled step": statistics.median(non),
        "hooks, sampled step": statistics.median(sampled),
        f"all-in mean per step at interval {interval}": statistics.median(mean_extra),
    }


def publish_costs(repeats: int) -> dict[str, float]:
    """ns to pack a row, launch its gather, judge a step and build + sink its report."""
    distributed = dist.is_initialized()
    world = dist.get_world_size() if distributed else 1
    gather = SideGroupGather(list(range(world)), 0) if distributed else LocalGather()
    timer = C.StageTimer(len(STAGES), 1, 0, 4096, False)

    def sample(step: int):
        timer.begin_step(step)
        for s in STEP_SECTIONS:
            timer.start(s)
            timer.stop(s)
        return timer.end_step()

    one = sample(7)
    out = {"pack": per_call_ns(lambda: row_from_sample(one, 512.0, 0), 2000, repeats)}

    launches = []
    for i in range(repeats * 50):
        row = row_from_sample(sample(i), 512.0, gather.rank)
        t0 = time.perf_counter_ns()
        pending = gather.gather(row)
        launches.append(time.perf_counter_ns() - t0)
        if pending is not None:
            pending.wait()
    gather.close()
    out["gather launch"] = float(np.median(launches))

    config = StragglerConfig(enabled=True)
    vc = verdict_config(config)
    names = list(STAGES)
    rng = np.random.default_rng(0)
    for ranks in sorted({world, 1024}):
        matrix = rng.normal(40.0, 1.0, (ranks, len(STAGES)))
        out[f"verdict, {ranks} ranks"] = per_call_ns(lambda m=matrix: core().judge_step(m, names, 0, vc), 200, repeats)

    rows = np.stack([row_from_sample(sample(0), 512.0, r) for r in range(world)])
    with tempfile.TemporaryDirectory() as tmp:
        summary, jsonl = RunSummary(), JsonlSink(str(Path(tmp) / "r.jsonl"))

        def report() -> None:
            rep = build_report(unpack(rows), 0, config, 0, {"dropped_reports": 0})
            summary.write(rep)
            jsonl.write(rep)

        out[f"report, {world} ranks (verdict + summary + JSONL)"] = per_call_ns(report, 200, repeats)
        jsonl.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--number", type=int, default=20_000, help="Calls per repeat of the section costs.")
    p.add_argument("--steps", type=int, default=400, help="Minimal steps per A/B block.")
    p.add_argument("--interval", type=int, default=20, help="Sampling interval of the step-cost blocks.")
    p.add_argument("--step-ms", type=float, default=None,
                   help="Step time for the estimate (default: bare ms/step of runs/overhead.json if present).")
    p.add_argument("--output", type=str, default="runs/section_cost.json")
    args = p.parse_args()
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[local % len(cores)]})
    torch.set_num_threads(1)
    rank = dist.get_rank() if dist.is_initialized() else 0

    costs = {**section_costs(args.number, args.repeats)}
    costs["end-of-step read (6 sections)"] = read_cost(args.repeats)
    costs.update(step_costs(args.steps, args.repeats, args.interval))
    costs.update(publish_costs(args.repeats))

    if rank == 0:
        step_ms = args.step_ms
        overhead_json = Path("runs/overhead.json")
        if step_ms is None and overhead_json.exists():
            rows = json.loads(overhead_json.read_text())["rows"]
            step_ms = next((r["wall_ms_per_step"] for r in rows if r["variant"] == "bare"), None)
        print(f"{'cost':<48}{'ns':>12}")
        for name, ns in costs.items():
            print(f"{name:<48}{ns:>12,.0f}")
        estimate = {}
        if step_ms:
            non, sampled = costs["hooks, non-sampled step"], costs["hooks, sampled step"]
            report_ns = next(v for k, v in costs.items() if k.startswith("report,"))
            print(f"\nestimated overhead for a {step_ms:.2f} ms step (training thread; + report, serialized):")
            for k in (1, 10, 100):
                thread_ns = ((k - 1) * non + sampled) / k
                bound_ns = thread_ns + report_ns / k
                thread_pct, bound_pct = (100.0 * ns / (step_ms * 1e6) for ns in (thread_ns, bound_ns))
                estimate[k] = {"training_thread_percent": thread_pct, "with_report_percent": bound_pct}
                print(f"  interval {k:>3}: {thread_ns / 1e3:8.2f} us/step = {thread_pct:.4f} %;  "
                      f"{bound_ns / 1e3:8.2f} us/step = {bound_pct:.4f} %")
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"costs_ns": costs, "step_ms": step_ms, "estimate_percent": estimate,
                                   "world_size": dist.get_world_size() if dist.is_initialized() else 1,
                                   "loadavg": list(os.getloadavg())}, indent=2))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

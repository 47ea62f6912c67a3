"""Step-time overhead of relax_straggler and of its peers on the demo GPT (DDP over Gloo).

    torchrun --standalone --nproc-per-node 2 benchmarks/overhead.py [--rounds 20] [--steps 100]

Variants, all driven by the same training step (benchmarks/peers/__init__.py):
  bare                 no instrumentation (every ratio divides by it)
  off                  relax_straggler installed disabled (a NullAnalyzer, a data section)
  ours/1, /10, /100    relax_straggler sampling every 1st, 10th, 100th step
  ours-kernel-stats/10 ours/10 with --straggler-kernel-stats (kernel records of sampled
                       steps; where the build has no CUPTI it warns and runs as ours/10);
                       only when named in --variants
  paused               relax_straggler at interval 10 paused at runtime through its control
                       file (read every 50 steps): run with --warmup 55 or more, so that the
                       pause (applied from step 51) covers the timed steps
  megatron-sync        Megatron-style timers: device synchronize at every start/stop,
                       all-gather of a [world, timers] tensor every 10 steps
  nvrx/1, nvrx/10      NVRx straggler Detector sections, profiling interval 1 or 10; on a
                       CPU-only torch without its report (it cannot run there)

Method. The variants run in alternating blocks inside one job and the order rotates
every round, so slow drifts of the machine hit every variant alike. A block installs
the variant, runs --warmup untimed steps, then --steps timed steps, then uninstalls.
Per block: the mean wall time per step (total / steps, with a device synchronize at both
ends on CUDA) and the mean process CPU time per step (all threads of the rank, so the
report thread and Gloo's are counted; time spent descheduled by other load is not).
The mean, not the median, of steps: the work of a sampled step lands on one step in
`interval`, and a median of steps would leave it out. --steps must be a multiple of the
largest interval (NVRx profiling and Megatron log intervals included) so every timed
block holds exactly steps/interval sampled steps. Per round each variant's block is
divided by the same round's bare block; the table gives the median ratio over rounds
and its 95 % percentile-bootstrap interval. Rank 0's times are
reported (DDP's gradient all-reduce makes the ranks' step times equal to within noise).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import numpy as np
import torch
import torch.distributed as dist

import relax_straggler
from relax_straggler import StragglerConfig
from relax_straggler.demo import GPT, Batches, GPTConfig, load_corpus, next_token_loss

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import NULL_SECTION, BareProbe, Probe  # noqa: E402  (benchmarks/peers, beside this file)


class OurProbe:
    """relax_straggler as a user installs it: hooks time forward, backward (+ gradient
    sync) and optimizer; the script opens a data section and gives its workload."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, interval: int | None,
                 collective_timing: bool = True, paused: bool = False, kernel_stats: bool = False) -> None:
        control = None
        if paused:
            fd, control = tempfile.mkstemp(suffix=".json")
            with os.fdopen(fd, "w") as fh:
                fh.write('{"enabled": false}')
        config = StragglerConfig(enabled=interval is not None, interval=interval or 1, warmup_steps=0,
                                 collective_timing=collective_timing, control_file=control,
                                 kernel_stats=kernel_stats)
        self.analyzer = relax_straggler.install(model, optimizer, config=config)
        self._data = self.analyzer.section("data")
        self._control = control

    def section(self, stage: str) -> ContextManager[Any]:
        return self._data if stage == "data" else NULL_SECTION

    def workload(self, tokens: int) -> None:
        self.analyzer.set_workload(tokens)

    def end_step(self) -> None:
        pass  # the optimizer post-hook ended the step

    def counters(self) -> dict[str, int]:
        if not self.analyzer.enabled:
            return {}
        t = self.analyzer.timer
        return {"read_points": t.read_points, "events_recorded": t.events_recorded, **self.analyzer.counters()}

    def close(self) -> None:
        self.analyzer.uninstall()
        if self._control is not None:
            os.unlink(self._control)


Factory = Callable[[torch.nn.Module, torch.optim.Optimizer, torch.device], Probe]
MEGATRON_LOG_INTERVAL = 10  # steps between the Megatron-style timers' all-gathers


def _megatron(model, optimizer, device) -> Probe:
    from peers.megatron_timer import SyncTimers

    return SyncTimers(device, log_interval=MEGATRON_LOG_INTERVAL)


def _nvrx(profiling_interval: int) -> Factory:
    def make(model, optimizer, device) -> Probe:
        from peers.nvrx import NvrxProbe

        cuda = device.type == "cuda"
        return NvrxProbe(profile_cuda=cuda, report=cuda, profiling_interval=profiling_interval)

    return make


VARIANTS: dict[str, Factory] = {
    "bare": lambda model, optimizer, device: BareProbe(),
    "off": lambda model, optimizer, device: OurProbe(model, optimizer, None),
    "ours/1": lambda model, optimizer, device: OurProbe(model, optimizer, 1),
    "ours/10": lambda model, optimizer, device: OurProbe(model, optimizer, 10),
    "ours/100": lambda model, optimizer, device: OurProbe(model, optimizer, 100),
    "ours-no-collectives/10": lambda model, optimizer, device: OurProbe(model, optimizer, 10, collective_timing=False),
    "ours-kernel-stats/10": lambda model, optimizer, device: OurProbe(model, optimizer, 10, kernel_stats=True),
    "paused": lambda model, optimizer, device: OurProbe(model, optimizer, 10, paused=True),
    "megatron-sync": _megatron,
    "nvrx/1": _nvrx(1),
    "nvrx/10": _nvrx(10),
}


# Run only when named: CUPTI in the process (benchmarks/gpu/check.sh measures it in a job of its own).
OPT_IN = ("ours-kernel-stats/10",)


@dataclass(frozen=True)
class Block:
    """One variant's timed block: mean wall and process-CPU ms per step, counter deltas."""

    wall_ms: float
    cpu_ms: float
    counters: dict[str, int]


def bootstrap_ci(x: np.ndarray, rng: np.random.Generator, n: int = 10_000) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of x."""
    samples = rng.choice(x, size=(n, len(x)), replace=True)
    lo, hi = np.percentile(np.median(samples, axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--steps", type=int, default=100,
                   help="Timed steps per block: a multiple of the largest interval among the variants.")
    p.add_argument("--warmup", type=int, default=5, help="Untimed steps at the start of each block.")
    p.add_argument("--variants", nargs="+", default=[v for v in VARIANTS if v not in OPT_IN], choices=list(VARIANTS))
    p.add_argument("--device", default="cpu", help="cpu or cuda (each rank on GPU LOCAL_RANK % device_count).")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--output", type=str, default="runs/overhead.json")
    args = p.parse_args()
    if "bare" not in args.variants:
        args.variants.insert(0, "bare")
    periods = [int(v.split("/")[1]) for v in args.variants if "/" in v]
    periods += [MEGATRON_LOG_INTERVAL] if "megatron-sync" in args.variants else []
    period = max(periods + [1])
    if args.steps % period:
        p.error(f"--steps must be a multiple of {period}: whole sampling periods of every interval in --variants")
    return args


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.device == "cuda":
        device = torch.device("cuda", local % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[local % len(cores)]})
        torch.set_num_threads(1)
    torch.manual_seed(0)

    names = list(args.variants)
    if any(n.startswith("nvrx") for n in names):
        from peers.nvrx import unavailable_reason

        reason = unavailable_reason()
        if reason is not None:
            names = [n for n in names if not n.startswith("nvrx")]
            if rank == 0:
                print(f"skipping nvrx variants: {reason}", flush=True)

    gpt = GPT(GPTConfig(seq_len=args.seq_len, d_model=args.d_model, heads=args.heads, layers=args.layers)).to(device)
    model = torch.nn.parallel.DistributedDataParallel(gpt)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    batches = Batches(load_corpus(1_000_000), args.batch_size, args.seq_len, seed=0, rank=rank)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def train_step(probe: Probe) -> None:
        with probe.section("data"):
            x, y = (t.to(device, non_blocking=True) for t in batches.next())
        probe.workload(x.numel())
        with probe.section("forward"):
            logits = model(x)
            loss = next_token_loss(logits, y)
        with probe.section("backward"):
            loss.backward()
        with probe.section("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        probe.end_step()

    def block(name: str) -> Block:
        probe = VARIANTS[name](model, optimizer, device)
        try:
            for _ in range(args.warmup):
                train_step(probe)
            before = dict(probe.counters())
            sync()
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                train_step(probe)
            sync()
            w1, c1 = time.perf_counter(), time.process_time()
            after = probe.counters()
        finally:
            probe.close()
        return Block(wall_ms=(w1 - w0) * 1e3 / args.steps, cpu_ms=(c1 - c0) * 1e3 / args.steps,
                     counters={k: after[k] - before.get(k, 0) for k in after})

    for name in names:  # one untimed block each: allocator, DDP buckets, lazy imports
        block(name)
    blocks: dict[str, list[Block]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            blocks[name].append(block(name))
        if rank == 0:
            print(f"round {r + 1}/{args.rounds}: bare {blocks['bare'][-1].wall_ms:.2f} ms/step", flush=True)

    if rank == 0:
        report(args, names, blocks, dist.get_world_size(), device)
    gc.collect()  # DDP's reference cycles, while Gloo threads can still take the GIL
    dist.destroy_process_group()


def report(args: argparse.Namespace, names: list[str], blocks: dict[str, list[Block]], world: int,
           device: torch.device) -> None:
    rng = np.random.default_rng(0)
    bare_wall = np.array([b.wall_ms for b in blocks["bare"]])
    bare_cpu = np.array([b.cpu_ms for b in blocks["bare"]])
    rows = []
    header = (f"{'variant':<15}{'ms/step':>9}{'wall ratio':>12}{'95% CI':>20}{'cpu ratio':>11}{'95% CI':>20}"
              f"  per 100 steps")
    print(header)
    for name in names:
        wall = np.array([b.wall_ms for b in blocks[name]])
        cpu = np.array([b.cpu_ms for b in blocks[name]])
        wr, cr = wall / bare_wall, cpu / bare_cpu
        wlo, whi = bootstrap_ci(wr, rng)
        clo, chi = bootstrap_ci(cr, rng)
        per100 = {k: round(100.0 * np.mean([b.counters.get(k, 0) for b in blocks[name]]) / args.steps, 2)
                  for k in blocks[name][0].counters}
        rows.append({"variant": name, "wall_ms_per_step": float(np.median(wall)),
                     "wall_ratio": float(np.median(wr)), "wall_ci95": [wlo, whi],
                     "cpu_ms_per_step": float(np.median(cpu)), "cpu_ratio": float(np.median(cr)),
                     "cpu_ci95": [clo, chi], "counters_per_100_steps": per100})
        counters = ", ".join(f"{k} {v:g}" for k, v in per100.items() if k in (
            "read_points", "events_recorded", "synchronize_calls", "gathers", "reports"))
        print(f"{name:<15}{np.median(wall):>9.2f}{np.median(wr):>12.4f}{f'[{wlo:.4f}, {whi:.4f}]':>20}"
              f"{np.median(cr):>11.4f}{f'[{clo:.4f}, {chi:.4f}]':>20}  {counters}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "world_size": world,
        "device": str(device), "torch": torch.__version__, "loadavg_at_end": list(os.getloadavg()),
        "model": {k: getattr(args, k) for k in ("layers", "d_model", "heads", "seq_len", "batch_size")},
        "rows": rows,
        "blocks": {n: [{"wall_ms": b.wall_ms, "cpu_ms": b.cpu_ms} for b in blocks[n]] for n in names},
    }, indent=2))


if __name__ == "__main__":
    main()

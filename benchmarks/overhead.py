"""Step-time overhead of the analyzer on the demo GPT, DDP over Gloo, 2 ranks.

    torchrun --standalone --nproc-per-node 2 benchmarks/overhead.py [--rounds 10] [--steps 60]

Variants run in alternating blocks inside one job (the order rotates every round), so
slow drifts of the machine hit every variant alike: off, and on at interval 1, 10 and 100.
Per round, each variant's median step time is divided by the same round's "off" median;
the table gives the median ratio over rounds and a 95 % bootstrap interval.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

import relax_straggler
from relax_straggler import StragglerConfig
from relax_straggler.demo import GPT, Batches, GPTConfig, load_corpus

Variant = Callable[[torch.nn.Module, torch.optim.Optimizer], object]


def analyzer_variant(interval: int | None) -> Variant:
    def setup(model, optimizer):
        config = StragglerConfig(enabled=interval is not None, interval=interval or 1, warmup_steps=0)
        return relax_straggler.install(model, optimizer, config=config)

    return setup


VARIANTS: dict[str, Variant] = {
    "off": analyzer_variant(None),
    "on, interval 1": analyzer_variant(1),
    "on, interval 10": analyzer_variant(10),
    "on, interval 100": analyzer_variant(100),
}


def bootstrap_ci(x: np.ndarray, rng: np.random.Generator, n: int = 10_000) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the median of x."""
    samples = rng.choice(x, size=(n, len(x)), replace=True)
    lo, hi = np.percentile(np.median(samples, axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps", type=int, default=60, help="Timed steps per block.")
    p.add_argument("--warmup", type=int, default=5, help="Untimed steps at the start of each block.")
    p.add_argument("--output", type=str, default="runs/overhead.json")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", 0))
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[local % len(os.sched_getaffinity(0))]})
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(GPT(GPTConfig(seq_len=64)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    batches = Batches(load_corpus(1_000_000), 8, 64, seed=0, rank=rank)

    def train_step(analyzer) -> float:
        t0 = time.perf_counter()
        with analyzer.section("data"):
            x, y = batches.next()
        logits = model(x)
        F.cross_entropy(logits.view(-1, logits.shape[-1]), y.reshape(-1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return (time.perf_counter() - t0) * 1e3

    names = list(VARIANTS)
    medians = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            analyzer = VARIANTS[name](model, optimizer)
            for _ in range(args.warmup):
                train_step(analyzer)
            times = [train_step(analyzer) for _ in range(args.steps)]
            analyzer.uninstall()
            medians[name].append(float(np.median(times)))

    if rank == 0:
        rng = np.random.default_rng(0)
        off = np.array(medians["off"])
        rows = []
        print(f"{'variant':<20}{'median step ms':>16}{'ratio to off':>14}{'95% CI':>22}")
        for name in names:
            ratio = np.array(medians[name]) / off
            lo, hi = bootstrap_ci(ratio, rng)
            rows.append({"variant": name, "median_step_ms": float(np.median(medians[name])),
                         "ratio": float(np.median(ratio)), "ci95": [lo, hi]})
            print(f"{name:<20}{np.median(medians[name]):>16.2f}{np.median(ratio):>14.4f}{f'[{lo:.4f}, {hi:.4f}]':>22}")
        os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
        with open(args.output, "w") as fh:
            json.dump({"rounds": args.rounds, "steps": args.steps, "rows": rows, "medians": medians}, fh, indent=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

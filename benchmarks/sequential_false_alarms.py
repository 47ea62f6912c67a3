"""The sequential test's false alarms, measured against its bound (docs/DETECTION.md).

Healthy 4-rank runs of the jitter model of benchmarks/detection_quality.py (uniform and
heavy-tailed sleeps in forward, no straggler) go through the product's confirmed verdict
(ConfirmedVerdict with the defaults but `sequential_budget`) for `--reports` reports each;
a false alarm is a rank entering state `straggler` (every rank is healthy). The bound by
design is `sequential_budget` false alarms per report; looser budgets than the default
make the rate large enough to compare with it.

    .venv/bin/python benchmarks/sequential_false_alarms.py [--reports 20000] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from detection_quality import STAGES, Scenario, generate_jitter  # noqa: E402
from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict  # noqa: E402

BUDGETS = (1e-3, 1e-2, 1e-1)


def false_alarms(jitter: str, budget: float, reports: int, seed: int) -> tuple[int, int]:
    """(rank confirmations of any path, of them by the sequential test) over one healthy run."""
    ms = generate_jitter(Scenario("healthy", jitter=jitter), reports, seed)
    verdict = ConfirmedVerdict(ConfirmConfig(sequential_budget=budget))
    named: set[tuple[int, str]] = set()
    total = sequential = 0
    for s in range(reports):
        now = {(f.rank, f.stage): f.by_sequential for f in verdict.update(s, ms[s], STAGES).findings
               if f.state == "straggler"}
        for key, by_sequential in now.items():
            if key not in named:
                total += 1
                sequential += by_sequential
        named = set(now)
    return total, sequential


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", type=int, default=20000, help="reports per run (>= 100)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.reports < 100:
        p.error("--reports must be >= 100")
    t0 = time.perf_counter()
    print("| jitter | sequential_budget | bound (false alarms / 1k reports) | confirmed, all paths / 1k reports "
          "| of them by the sequential test / 1k reports |")
    print("|---|---|---|---|---|")
    for jitter in ("uniform", "heavy-tailed"):
        for budget in BUDGETS:
            total, sequential = false_alarms(jitter, budget, args.reports, args.seed)
            k = 1000.0 / args.reports
            print(f"| {jitter} | {budget:g} | {budget * 1000:g} | {total * k:.2f} ({total}) "
                  f"| {sequential * k:.2f} ({sequential}) |")
    print(f"\n{args.reports} reports per run, 4 ranks x 4 compute stages; {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

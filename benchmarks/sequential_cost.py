"""What the sequential test adds to the confirmed verdict's report (docs/DETECTION.md).

ConfirmedVerdict.update on synthetic healthy reports (5 core stages of ~40 ms with 1.5 %
jitter, a fresh matrix per report), with the sequential test off (sequential_budget 0) and
on (the default), per layout; median wall time per report over `--reports` after 20 warm.

    .venv/bin/python benchmarks/sequential_cost.py [--reports 100]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict  # noqa: E402

STAGES = ("forward", "backward", "optimizer", "communication", "data")
LAYOUTS = ((1024, 1024), (1024, 32), (1024, 2), (8192, 8192), (8192, 32))  # (ranks, group size)
WARM = 20


def per_report_ms(ranks: int, group: int, budget: float, reports: int, seed: int = 0) -> float:
    rng = np.random.default_rng(seed)
    groups = (np.arange(ranks) // group).tolist()
    verdict = ConfirmedVerdict(ConfirmConfig(sequential_budget=budget))
    times = []
    for s in range(WARM + reports):
        ms = 40.0 * np.exp(rng.normal(0.0, 0.015, (ranks, len(STAGES))))
        t0 = time.perf_counter()
        verdict.update(s, ms, STAGES, groups=groups)
        if s >= WARM:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reports", type=int, default=100)
    args = p.parse_args(argv)
    print("| ranks | comparison groups of | tracker, sequential test off (ms) | on (ms) |")
    print("|---|---|---|---|")
    for ranks, group in LAYOUTS:
        off = per_report_ms(ranks, group, 0.0, args.reports)
        on = per_report_ms(ranks, group, 1e-3, args.reports)
        print(f"| {ranks} | {group} | {off:.3f} | {on:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

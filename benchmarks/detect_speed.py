"""Window-detector speed: the ensemble over ranks x 8 stages x 100 steps, per algorithm,
and how it scales with ranks (target: < 1 s at 16,384 ranks on the 2-core reference VM).

    .venv/bin/python benchmarks/detect_speed.py                 # table for docs/PERFORMANCE.md
    .venv/bin/python benchmarks/detect_speed.py --ranks 16384 --repeats 5

Data: 8 stages (6 compute, 2 communication), 3 % log-normal jitter, rank 7 20 % slower
in compute and late to the collectives. Per detect.window call, best of --repeats runs:
wall_ms (the engine's clock) and cpu_ms (process CPU time, all threads: what the call
costs whatever else runs on the machine); per algorithm, the CPU time of its
clustering over all stages. cpu_ms minus the algorithms is the shared work (features,
coreset, distances, votes).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from relax_straggler.window import detector as detect

STAGES = ("forward", "backward", "optimizer", "data", "attention", "moe", "communication", "communication/allreduce")
BASE_MS = np.array([40.0, 80.0, 10.0, 3.0, 20.0, 15.0, 30.0, 12.0])


def window(ranks: int, steps: int = 100, seed: int = 42) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ms = BASE_MS * np.exp(rng.normal(0.0, 0.03, (steps, ranks, len(STAGES))))
    ms[:, 7, :6] *= 1.2
    ms[:, 7, 6:] *= 0.6
    return ms


def measure(ranks: int, repeats: int, threads: int) -> dict:
    ms = window(ranks)
    cfg = detect.WindowConfig(threads=threads)
    best = None
    for _ in range(repeats):
        cpu0 = time.process_time()
        r = detect.window(ms, STAGES, cfg)
        cpu = (time.process_time() - cpu0) * 1e3
        if best is None or cpu < best[1]:
            best = (r, cpu)
    r, cpu = best
    assert r.anomaly_ranks == (7,), f"{ranks} ranks: expected rank 7, got {r.anomaly_ranks}"
    return {"ranks": ranks, "threads": threads, "wall_ms": r.elapsed_ms, "cpu_ms": cpu, **r.algorithm_cpu_ms}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    cols = ["ranks", "threads", "wall_ms", "cpu_ms", *detect.ALGORITHMS]
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---:" for _ in cols) + "|")
    for ranks in args.ranks:
        for threads in args.threads:
            row = measure(ranks, args.repeats, threads)
            print("| " + " | ".join(str(row[c]) if c in ("ranks", "threads") else f"{row[c]:.0f}" for c in cols) + " |")
    print(f"\n{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; 8 stages x 100 steps; "
          f"best of {args.repeats} by CPU time; ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

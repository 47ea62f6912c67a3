"""Speed of `relax-straggler analyze` (docs/PERFORMANCE.md, "Offline analysis").

    .venv/bin/python benchmarks/analyze_speed.py                 # both cases
    .venv/bin/python benchmarks/analyze_speed.py --case ar
    .venv/bin/python benchmarks/analyze_speed.py --case timers --ranks 16384 --steps 1000

Cases:
  ar      the what-if AR trace (117,216 op rows, 64 ranks) read from
          tests/data/whatif-traces, end to end: read, attribute, summarize.
  timers  a synthetic Megatron `--timing-log-option all` log of RANKS ranks x STEPS
          iterations (dp = RANKS / 2, pp = 2, tp = 1; timers forward-compute, backward-compute,
          forward-send, forward-recv, grads-reduce-scatter, optimizer; one slow worker),
          written once to --cache-dir, then analyzed.
Each case is timed in-process (the analysis alone: read, attribute, summarize) and end to
end (a fresh `relax-straggler analyze PATH --format json` process: start-up, imports and
analysis; the median of --repeats runs), reported as seconds and rows/s (op rows for
traces, rank lines for logs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACES = os.path.join(REPO, "tests", "data", "whatif-traces")
TIMERS = {"forward-compute": 300.0, "backward-compute": 600.0, "forward-send": 12.0, "forward-recv": 15.0,
          "grads-reduce-scatter": 60.0, "optimizer": 40.0}
VARIANTS = 8  # distinct pre-formatted block bodies per timer, combined at random


def _body(ranks: np.ndarray, base: float, rng: np.random.Generator) -> bytes:
    values = base * rng.uniform(0.97, 1.03, ranks.size)
    return "".join(f"     rank {r:2d}: {v:.2f}\n" for r, v in zip(ranks.tolist(), values.tolist())).encode()


def write_timer_log(path: str, ranks: int, steps: int, seed: int = 0) -> int:
    """Writes the synthetic log; returns the number of rank lines. Rank `ranks // 3` (a
    pipeline stage 0 worker) is 1.8x slow in forward-compute in every step."""
    rng = np.random.default_rng(seed)
    half = ranks // 2
    everyone, first, second = np.arange(ranks), np.arange(half), np.arange(half, ranks)
    who = {"forward-send": first, "forward-recv": second}
    slow = ranks // 3
    bodies = {}
    for name, base in TIMERS.items():
        rows = who.get(name, everyone)
        bodies[name] = [_body(rows, base, rng) for _ in range(VARIANTS)]
    head = ["------------------------ arguments ------------------------"]
    for k, v in (("pipeline_model_parallel_size", 2), ("tensor_model_parallel_size", 1), ("world_size", ranks)):
        head.append(f"  {k} {'.' * (48 - len(k))} {v}")
    head.append("-------------------- end of arguments ---------------------")
    lines = 0
    with open(path + ".tmp", "wb") as f:
        f.write(("\n".join(head) + "\n").encode())
        for it in range(1, steps + 1):
            f.write(f" iteration {it:8d}/{steps:8d} | elapsed time per iteration (ms): 1100.0 |\n"
                    "times across ranks (ms):\n".encode())
            for name, variants in bodies.items():
                body = variants[int(rng.integers(VARIANTS))]
                if name == "forward-compute":
                    marker = f"     rank {slow:2d}: ".encode()
                    at = body.index(marker)
                    end = body.index(b"\n", at)
                    body = body[:at] + marker + f"{TIMERS[name] * 1.8:.2f}".encode() + body[end:]
                f.write(f"  {name}:\n".encode() + body)
                lines += len(who.get(name, everyone))
    os.replace(path + ".tmp", path)
    return lines


def _run(path: str, rows: int, label: str, repeats: int) -> None:
    from relax_straggler.analysis import AnalyzeConfig, analyze, build_summary
    from relax_straggler.readers import open_source

    t0 = time.perf_counter()
    summary = build_summary(analyze(open_source(path), AnalyzeConfig()))
    seconds = time.perf_counter() - t0
    found = [(a["kind"], a["dp_rank"], a["pp_rank"], a["stages"]) for a in summary["anomalies"]]
    print(f"{label}: in process {seconds:.2f} s, {rows / seconds:,.0f} rows/s, "
          f"{os.path.getsize(path) / seconds / 1e6:,.0f} MB/s; verdict {summary['verdict']['status']}: {found}")
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([os.path.join(os.path.dirname(sys.executable), "relax-straggler"), "analyze", path, "--format", "json"],
                       stdout=subprocess.DEVNULL, check=True)
        walls.append(time.perf_counter() - t0)
    print(f"{label}: end to end {statistics.median(walls):.2f} s (median of {repeats}; "
          f"min {min(walls):.2f}, max {max(walls):.2f})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=("ar", "timers", "all"), default="all")
    p.add_argument("--ranks", type=int, default=16384)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--cache-dir", default="/tmp/relax_straggler_bench")
    p.add_argument("--repeats", type=int, default=5, help="end-to-end runs of the AR case (the timer log runs once)")
    args = p.parse_args()

    if args.case in ("ar", "all"):
        trace = os.path.join(TRACES, "trace-AR.parquet")
        if not os.path.exists(trace):
            print(f"missing {trace}: the what-if traces are expected beside the repository", file=sys.stderr)
            return 1
        import pyarrow.parquet as pq

        _run(trace, pq.ParquetFile(trace).metadata.num_rows, "AR parquet trace", args.repeats)
    if args.case in ("timers", "all"):
        os.makedirs(args.cache_dir, exist_ok=True)
        log = os.path.join(args.cache_dir, f"timers-{args.ranks}x{args.steps}.log")
        rows = args.steps * (4 * args.ranks + args.ranks)  # four timers on every rank, send/recv on half each
        if not os.path.exists(log):
            t0 = time.perf_counter()
            rows = write_timer_log(log, args.ranks, args.steps)
            print(f"wrote {log} ({os.path.getsize(log) / 1e9:.2f} GB) in {time.perf_counter() - t0:.1f} s")
        _run(log, rows, f"timer log {args.ranks} ranks x {args.steps} steps", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

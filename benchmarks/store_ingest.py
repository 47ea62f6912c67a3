"""Ingest throughput into ClickHouse (docs/PERFORMANCE.md, "Metrics store: ClickHouse ingest").

    .venv/bin/python benchmarks/store_ingest.py                       # private server, defaults
    .venv/bin/python benchmarks/store_ingest.py --ranks 1024 --steps 100 --repeats 3
    .venv/bin/python benchmarks/store_ingest.py --store clickhouse://127.0.0.1:8123/bench

Without --store a private ClickHouse 26.9 server process (chDB behind
tests/services/chdb_front.py) is started on a free 127.0.0.1 port in a temporary directory
and stopped at the end.

Measured, each the median of --repeats runs into a fresh job:
  ingest       `relax-straggler ingest` in process on a synthetic straggler.jsonl of RANKS
               ranks x STEPS steps (forward, backward, optimizer, communication, data): read,
               convert, write in batches of --batch-rows; rows/s of megatron_metrics rows.
  write_table  the store alone: one prebuilt SAMPLE_SCHEMA table of the same rows per call.
  iterations   store.iterations(job) over the ingested job (the monitor's poll), ms.
  samples      store.samples(job, ...) streaming every row back, rows/s.
Bounded: RANKS x STEPS x 6 rows per run (default 614,400), --repeats runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "services"))

from relax_straggler.stores.clickhouse import ClickHouseStore  # noqa: E402
from relax_straggler.monitor.ingest import ingest  # noqa: E402
from relax_straggler.readers import open_source  # noqa: E402

STAGES = {"forward": 300.0, "backward": 600.0, "optimizer": 40.0, "communication": 80.0, "data": 5.0}


def write_jsonl(path: str, ranks: int, steps: int, seed: int = 0) -> None:
    """RANKS x STEPS report lines; rank ranks // 3 is 1.5x slow in forward."""
    rng = np.random.default_rng(seed)
    base = np.array(list(STAGES.values()))
    with open(path, "w", encoding="utf-8") as f:
        for step in range(steps):
            ms = base * rng.uniform(0.97, 1.03, (ranks, base.size))
            ms[ranks // 3, 0] *= 1.5
            f.write(json.dumps({"step": step, "stages": list(STAGES), "device_ms": np.round(ms, 3).tolist()}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default=None, help="clickhouse://HOST:PORT/DB (default: a private server)")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-rows", type=int, default=100_000)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="store_ingest_")
    server = None
    url = args.store
    if url is None:
        from chdb_front import ServerProcess

        server = ServerProcess(work)
        server.start()
        url = server.url("bench")
    try:
        path = os.path.join(work, "straggler.jsonl")
        write_jsonl(path, args.ranks, args.steps)
        store = ClickHouseStore(url)
        runs: dict[str, list[float]] = {"ingest": [], "write_table": [], "iterations_ms": [], "samples": []}
        rows = 0
        for i in range(args.repeats):
            job = f"bench-{os.getpid()}-{i}"
            stats = ingest(open_source(path), store, job, batch_rows=args.batch_rows)
            rows = stats.rows
            runs["ingest"].append(stats.rows_per_s)
            t = time.perf_counter()
            its = store.iterations(job)
            runs["iterations_ms"].append((time.perf_counter() - t) * 1e3)
            assert len(its) == args.steps, (len(its), args.steps)
            t = time.perf_counter()
            n = sum(1 for _ in store.samples(job, 0, args.steps))
            runs["samples"].append(n / (time.perf_counter() - t))
            assert n == stats.rows, (n, stats.rows)
        # The store alone: the same rows as one prebuilt table per call.
        from relax_straggler.stores.base import samples_to_table

        table = samples_to_table(list(store.samples(f"bench-{os.getpid()}-0", 0, args.steps)))
        for i in range(args.repeats):
            t = time.perf_counter()
            store.write_table(table.set_column(1, "job", [[f"raw-{os.getpid()}-{i}"] * table.num_rows]))
            runs["write_table"].append(table.num_rows / (time.perf_counter() - t))
        store.close()
        print(f"store {url}; {args.ranks} ranks x {args.steps} steps = {rows:,} rows per run; "
              f"median of {args.repeats}; load average {os.getloadavg()[0]:.1f}")
        for name, values in runs.items():
            unit = "ms" if name.endswith("_ms") else "rows/s"
            print(f"  {name:<14} {statistics.median(values):>12,.0f} {unit}  "
                  f"(range {min(values):,.0f}-{max(values):,.0f})")
    finally:
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

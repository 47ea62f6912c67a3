"""ClickHouse row formats: write and read rates of the store's TabSeparated and ArrowStream paths
(docs/PERFORMANCE.md, "Metrics store: ClickHouse row formats").

    .venv/bin/python benchmarks/clickhouse_rates.py                    # chDB 26.9, and 18.16 if installed
    .venv/bin/python benchmarks/clickhouse_rates.py --write-rows 200000 --read-rows 50000 --repeats 1

Engines: ClickHouse 26.9 (chDB behind tests/services/chdb_front.py, in this process) and,
where clickhouse-server is installed, Debian's 18.16 (tests/services/clickhouse.sh; it has
no Arrow, so TabSeparated only). Per engine and wire format, the median of --repeats runs:
  write    store.write_table of one prebuilt SAMPLE_SCHEMA table of --write-rows rows (body
           built and sent, the server acknowledges), rows/s;
  samples  store.samples streaming --read-rows rows back as Samples, rows/s;
  table    store.table reading the same rows as one SAMPLE_SCHEMA table, rows/s;
  steps    StoreSource.steps over the same range (Store.tables, column by column), steps/s
           (one step = 1,024 ranks x 6 timers).
Rows: 1,024 ranks x 6 timers per iteration, one value each, fixed seed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "services"))

from relax_straggler.stores.base import SAMPLE_SCHEMA  # noqa: E402
from relax_straggler.readers.metrics_rows import StoreSource  # noqa: E402
from relax_straggler.stores.clickhouse import ClickHouseStore  # noqa: E402

TIMERS = ["forward-compute", "backward-compute", "optimizer", "batch-generator", "all-grads-sync", "interval-time"]
RANKS = 1024


def rows(n: int, job: str, seed: int = 0) -> pa.Table:
    """n rows of `job`: RANKS x len(TIMERS) per iteration, values around 100 ms."""
    rng = np.random.default_rng(seed)
    i = np.arange(n)
    per_it = RANKS * len(TIMERS)
    ranks = (i // len(TIMERS)) % RANKS
    return pa.table({
        "timestamp": 1_790_000_000.0 + (i // per_it) + (i % 1000) / 1000.0,
        "job": pa.array([job] * n),
        "metric_name": pa.array([TIMERS[k] for k in i % len(TIMERS)]),
        "subname": pa.array([""] * n),
        "rank": ranks.astype(np.int32),
        "iteration": (i // per_it).astype(np.int64),
        "node": pa.array([f"node-{r // 8}" for r in ranks]),
        "cluster": pa.array(["c1"] * n),
        "metric_values": pa.array([[v] for v in np.round(rng.uniform(90, 110, n), 3)], pa.list_(pa.float64())),
    }, schema=SAMPLE_SCHEMA)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rate(count_of, n_expected=None) -> tuple[float, int]:
    t = time.perf_counter()
    n = count_of()
    rate = n / (time.perf_counter() - t)
    if n_expected is not None:
        assert n == n_expected, (n, n_expected)
    return rate, n


def measure(url: str, wire: str, write_rows: int, read_rows: int, repeats: int) -> dict:
    per_it = RANKS * len(TIMERS)
    last_it = max(read_rows // per_it, 1) - 1 if read_rows < write_rows else (write_rows - 1) // per_it
    expected = min(write_rows, (last_it + 1) * per_it)
    out: dict[str, list[float]] = {"write": [], "samples": [], "table": [], "steps": []}
    for k in range(repeats):
        store = ClickHouseStore(url, wire=wire, timeout_s=300.0)
        job = f"bench-{wire}-{k}"
        table = rows(write_rows, job)
        t = time.perf_counter()
        store.write_table(table)
        out["write"].append(write_rows / (time.perf_counter() - t))
        out["samples"].append(_rate(lambda: sum(1 for _ in store.samples(job, 0, last_it)), expected)[0])
        out["table"].append(_rate(lambda: store.table(job, 0, last_it).num_rows, expected)[0])
        source = StoreSource(store, job, 0, last_it)
        out["steps"].append(_rate(lambda: sum(1 for _ in source.steps()), last_it + 1)[0])
        store.close()
    return {name: statistics.median(v) for name, v in out.items()} | {"rows_read": expected}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-rows", type=int, default=1_000_000)
    p.add_argument("--read-rows", type=int, default=100_000, help="about this many rows (whole iterations)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        from chdb_front import ChdbFront

        front = ChdbFront(os.path.join(tmp, "chdb"), free_port())
        os.makedirs(front.data_dir)
        front.start()
        try:
            for wire in ("tsv", "arrow"):
                results.append(("ClickHouse 26.9 (chDB)", wire,
                                measure(front.url("bench"), wire, args.write_rows, args.read_rows, args.repeats)))
        finally:
            front.stop()
        if shutil.which("clickhouse-server") or os.path.exists("/usr/sbin/clickhouse-server"):
            sh = os.path.join(REPO, "tests", "services", "clickhouse.sh")
            port = free_port()
            subprocess.run(["bash", sh, "start", os.path.join(tmp, "ch"), str(port)], check=True)
            try:
                results.append(("ClickHouse 18.16", "tsv", measure(f"clickhouse://127.0.0.1:{port}/bench", "tsv",
                                                                    args.write_rows, args.read_rows, args.repeats)))
            finally:
                subprocess.run(["bash", sh, "stop", os.path.join(tmp, "ch")], check=True)
    print(f"{'engine':24} {'wire':6} {'write rows/s':>13} {'samples rows/s':>15} {'table rows/s':>13} "
          f"{'steps/s':>8} (write {args.write_rows:,} rows, read "
          f"{results[0][2]['rows_read']:,}, median of {args.repeats})")
    for engine, wire, r in results:
        print(f"{engine:24} {wire:6} {r['write']:13,.0f} {r['samples']:15,.0f} {r['table']:13,.0f} "
              f"{r['steps']:8,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

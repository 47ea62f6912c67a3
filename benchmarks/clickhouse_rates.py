"""ClickHouse write and read rates: the store's client path (clickhouse-connect, Arrow both ways)
against the TabSeparated-over-httpx path it replaced, on the same rows and server
(docs/PERFORMANCE.md, "Metrics store: ClickHouse client paths").

    .venv/bin/python benchmarks/clickhouse_rates.py
    .venv/bin/python benchmarks/clickhouse_rates.py --write-rows 200000 --read-rows 50000 --repeats 1

The server: ClickHouse 26.9 (chDB behind tests/services/chdb_front.py) in its own process on
127.0.0.1, as the tests run it. Per path, the median of --repeats runs:
  write    write_table of one prebuilt SAMPLE_SCHEMA table of --write-rows rows (the insert
           built and sent, the server acknowledges), rows/s;
  samples  samples() streaming --read-rows rows back as Samples, rows/s;
  table    table(): the same rows as one SAMPLE_SCHEMA table, rows/s;
  steps    StoreSource.steps over the same range (the store path only), steps/s
           (one step = 1,024 ranks x 6 timers).
The TabSeparated path is the store's previous client, kept here as the baseline: the body
built column by column in Arrow compute, one httpx POST per insert; answers parsed line by
line into Samples. Rows: 1,024 ranks x 6 timers per iteration, one value each, fixed seed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests", "services"))

from relax_straggler.stores.base import SAMPLE_SCHEMA, Sample, samples_to_table  # noqa: E402
from relax_straggler.readers.metrics_rows import StoreSource  # noqa: E402
from relax_straggler.stores.clickhouse import ClickHouseStore  # noqa: E402
from relax_straggler.stores.clickhouse_rows import insert_table  # noqa: E402

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


def _rate(count_of, n_expected=None) -> tuple[float, int]:
    t = time.perf_counter()
    n = count_of()
    rate = n / (time.perf_counter() - t)
    if n_expected is not None:
        assert n == n_expected, (n, n_expected)
    return rate, n


class TabSeparatedBaseline:
    """The previous client path over the same table: TabSeparated bodies and answers over
    httpx. Layout and inserted columns come from the store (the same rows, the same SQL)."""

    _ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\0", "\\0"))
    _UNESCAPE = re.compile(r"\\(.)", re.S)
    _UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "\\": "\\", "'": "'"}

    def __init__(self, store: ClickHouseStore, port: int) -> None:
        self.store, self.http = store, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)

    def write_table(self, table: pa.Table) -> None:
        rows = insert_table(table, self.store.layout())
        columns = []
        for name in rows.column_names:
            col = rows.column(name)
            if pa.types.is_timestamp(col.type):  # DateTime64(3) reads "seconds.mmm"
                ms = pc.cast(col, pa.int64())
                sec = pc.divide(ms, 1000)
                frac = pc.utf8_lpad(pc.cast(pc.subtract(ms, pc.multiply(sec, 1000)), pa.string()), 3, "0")
                col = pc.binary_join_element_wise(pc.cast(sec, pa.string()), frac, ".")
            elif pa.types.is_list(col.type):
                col = pc.binary_join_element_wise("[", pc.binary_join(pc.cast(col, pa.list_(pa.string())), ","), "]", "")
            elif pa.types.is_string(col.type):
                for raw, escaped in self._ESCAPES:
                    col = pc.replace_substring(col, raw, escaped)
            columns.append(pc.cast(col, pa.string()))
        lines = pc.binary_join_element_wise(*columns, "\t").combine_chunks()
        one = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
        body = pc.binary_join(one, "\n")[0].as_buffer().to_pybytes() + b"\n"
        names = ", ".join(f"`{n}`" for n in rows.column_names)
        query = f"INSERT INTO {self.store._table} ({names}) FORMAT TabSeparated"
        r = self.http.post("/", params={"query": query, "wait_end_of_query": "1"}, content=body)
        assert r.status_code == 200, r.text

    def samples(self, job: str, first: int, last: int):
        layout = self.store.layout()
        quoted = "'" + job.replace("\\", "\\\\").replace("'", "\\'") + "'"
        sql = (f"SELECT {layout.select()} FROM {self.store._table} WHERE {layout.job_column} = {quoted} "
               f"AND iteration >= {first} AND iteration <= {last} "
               "ORDER BY _iteration, _rank, _metric_name, _subname FORMAT TabSeparated")
        un = self._untsv
        with self.http.stream("POST", "/", content=sql.encode()) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                ts_ms, job_, metric, subname, rank, it, node, cluster, values = line.split("\t")
                inner = values[1:-1]
                yield Sample(timestamp=int(ts_ms) / 1000.0, job=un(job_), metric_name=un(metric), rank=int(rank),
                             iteration=int(it), values=tuple(float(v) for v in inner.split(",")) if inner else (),
                             subname=un(subname), node=un(node), cluster=un(cluster))

    def table(self, job: str, first: int, last: int) -> pa.Table:
        return samples_to_table(list(self.samples(job, first, last)))

    def _untsv(self, field: str) -> str:
        return self._UNESCAPE.sub(lambda m: self._UNESCAPES.get(m.group(1), m.group(1)), field) if "\\" in field \
            else field


def measure(url: str, port: int, path: str, write_rows: int, read_rows: int, repeats: int) -> dict:
    per_it = RANKS * len(TIMERS)
    last_it = max(read_rows // per_it, 1) - 1 if read_rows < write_rows else (write_rows - 1) // per_it
    expected = min(write_rows, (last_it + 1) * per_it)
    out: dict[str, list[float]] = {"write": [], "samples": [], "table": [], "steps": []}
    for k in range(repeats):
        store = ClickHouseStore(url, timeout_s=300.0)
        store.write_table(rows(per_it, "warm-up"))  # creates the table: both paths write into it
        client = store if path == "store" else TabSeparatedBaseline(store, port)
        job = f"bench-{path}-{k}"
        table = rows(write_rows, job)
        t = time.perf_counter()
        client.write_table(table)
        out["write"].append(write_rows / (time.perf_counter() - t))
        out["samples"].append(_rate(lambda: sum(1 for _ in client.samples(job, 0, last_it)), expected)[0])
        out["table"].append(_rate(lambda: client.table(job, 0, last_it).num_rows, expected)[0])
        if path == "store":
            source = StoreSource(store, job, 0, last_it)
            out["steps"].append(_rate(lambda: sum(1 for _ in source.steps()), last_it + 1)[0])
        store.close()
    return {name: statistics.median(v) if v else float("nan") for name, v in out.items()} | {"rows_read": expected}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write-rows", type=int, default=1_000_000)
    p.add_argument("--read-rows", type=int, default=100_000, help="about this many rows (whole iterations)")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        from chdb_front import ServerProcess

        server = ServerProcess(tmp)
        server.start()
        port = server.port
        try:
            for path in ("tabseparated", "store"):
                results.append(("ClickHouse 26.9 (chDB)", path, measure(f"clickhouse://127.0.0.1:{port}/bench", port,
                                                                       path, args.write_rows, args.read_rows,
                                                                       args.repeats)))
        finally:
            server.stop()
    print(f"{'engine':24} {'path':12} {'write rows/s':>13} {'samples rows/s':>15} {'table rows/s':>13} "
          f"{'steps/s':>8} (write {args.write_rows:,} rows, read "
          f"{results[0][2]['rows_read']:,}, median of {args.repeats})")
    print(f"load average {os.getloadavg()[0]:.1f}")
    for engine, path, r in results:
        print(f"{engine:24} {path:12} {r['write']:13,.0f} {r['samples']:15,.0f} {r['table']:13,.0f} "
              f"{r['steps']:8,.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Load on the monitor service (docs/PERFORMANCE.md, "Monitor service").

    .venv/bin/python benchmarks/monitor_load.py                      # 200 jobs x 1,024 ranks, 60 s
    .venv/bin/python benchmarks/monitor_load.py --jobs 20 --ranks 64 --duration 20
    .venv/bin/python benchmarks/monitor_load.py --jobs 1000 --ranks 8 --clients 50 --stragglers 0 [--monitor-cpus 1]

What runs, all on 127.0.0.1, bounded by --duration:
  monitor   a `relax-straggler monitor` process over a fresh file store (--check-interval,
            default 1 s: 30x more polling than the service default), every job registered
            with its layout (dp = ranks, 8 ranks per node);
  writer    a second process writing one iteration per second per job (--jobs x --ranks
            ranks x 5 timers: forward-compute, backward-compute, optimizer, grads-all-reduce,
            interval-time), one write_table per job and iteration, 1 s step time; the first
            --stragglers jobs get +400 ms of forward on one rank from iteration --slow-from;
  load      --clients httpx threads in this process, each sending GET /{job} (twice), GET
            /jobs (its first page), GET / and GET /metrics in turn with --pause s between
            requests.
With --monitor-cpus N the monitor runs on the first N CPUs and the writer and the load on
the others (a service with cores of its own); by default all three share every CPU.
Reported: the writer's pace (did every second's writes finish within the second), the
poll cycle (GET /'s last_poll_s, sampled each second, and the poll histogram's mean)
against the check interval, API latency percentiles per endpoint, and per straggler job
the analysis time, the named rank and node, and the delay from the last slow iteration's
write to the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

CLI = [sys.executable, "-c", "import sys; from relax_straggler.cli import main; sys.exit(main())"]
STRAGGLER_MS = 400.0


def straggler_rank(job_index: int, ranks: int) -> int:
    return (7919 * (job_index + 1)) % ranks


def writer(args: argparse.Namespace) -> None:
    """The writer process: one iteration per second per job for --duration s (fewer when the
    writes of one iteration take more than a second: it stops at the end, mid-iteration if
    need be); prints JSON."""
    import pyarrow as pa

    from relax_straggler.monitor.feed import Injection, Synthetic, inject, step_table
    from relax_straggler.stores.opener import open_store

    store = open_store(args.store)
    base = next(Synthetic(ranks=args.ranks, iterations=1, step_ms=1000.0, seed=0).steps())
    templates = []  # per job: (normal table, slow table or None), iteration and timestamp set per write
    for j in range(args.jobs):
        normal = step_table(f"load-{j}", base, 0.0, ranks_per_node=8)
        slow = None
        if j < args.stragglers:
            inj = Injection(straggler_rank(j, args.ranks), 0, STRAGGLER_MS, 0)
            slow = step_table(f"load-{j}", inject(base, [inj]), 0.0, ranks_per_node=8)
        templates.append((normal, slow))
    names = templates[0][0].schema.names
    ts_col, it_col = names.index("timestamp"), names.index("iteration")
    start = time.time() + 0.5
    end = start + args.duration
    lags, write_s, rows, iterations = [], [], 0, 0
    last_slow_written = None  # when the 5th slow iteration (the trigger's last) was written, s
    for it in range(int(args.duration)):
        slot = start + it
        pause = slot - time.time()
        if pause > 0:
            time.sleep(pause)
        if time.time() >= end:
            break
        iterations += 1
        for normal, slow in templates:
            if time.time() >= end:
                break
            table = slow if slow is not None and it >= args.slow_from else normal
            n = table.num_rows
            now = time.time()
            table = table.set_column(ts_col, "timestamp", pa.array(np.full(n, now)))
            table = table.set_column(it_col, "iteration", pa.array(np.full(n, it, dtype=np.int64)))
            t0 = time.perf_counter()
            store.write_table(table)
            write_s.append(time.perf_counter() - t0)
            rows += n
        lags.append(time.time() - slot)
        if it == args.slow_from + 4:
            last_slow_written = time.time()
    print(json.dumps({"iterations": iterations, "writes": len(write_s), "rows": rows,
                      "write_ms_mean": 1000 * statistics.fmean(write_s), "write_ms_max": 1000 * max(write_s),
                      "second_used_max": max(lags), "second_used_mean": statistics.fmean(lags),
                      "last_slow_written": last_slow_written}))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list, q: float) -> float:
    return float(np.percentile(np.array(values) * 1000.0, q)) if values else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of writing (and of API load)")
    p.add_argument("--check-interval", type=float, default=1.0)
    p.add_argument("--stragglers", type=int, default=4, help="jobs with an injected straggler")
    p.add_argument("--slow-from", type=int, default=20, help="iteration the stragglers start at")
    p.add_argument("--clients", type=int, default=4, help="API load threads")
    p.add_argument("--pause", type=float, default=0.01, help="s between two requests of one client")
    p.add_argument("--monitor-cpus", type=int, default=0, metavar="N",
                   help="give the monitor the first N CPUs and the writer and the load the others, as a "
                        "service has its own cores (default 0: all processes share every CPU)")
    p.add_argument("--writer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--store", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.writer:
        writer(args)
        return
    import httpx

    cpus = sorted(os.sched_getaffinity(0))
    if not 0 <= args.monitor_cpus < len(cpus):
        raise SystemExit(f"--monitor-cpus must be in [0, {len(cpus) - 1}] on this machine")
    monitor_cpus, other_cpus = (cpus[:args.monitor_cpus], cpus[args.monitor_cpus:]) if args.monitor_cpus \
        else (cpus, cpus)
    os.sched_setaffinity(0, other_cpus)  # this process (the load) and the writer it starts
    workdir = tempfile.mkdtemp(prefix="monitor-load-")
    store = f"file://{workdir}/store"
    port = free_port()
    monitor = subprocess.Popen(CLI + ["monitor", "--store", store, "--port", str(port), "--check-interval",
                                      str(args.check_interval), "--hang-threshold", "30"],
                               cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(f"{workdir}/monitor.log", "w"),
                               preexec_fn=lambda: os.sched_setaffinity(0, monitor_cpus))
    base = f"http://127.0.0.1:{port}"
    client = httpx.Client(base_url=base, timeout=30.0)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/").status_code == 200:
                    break
            except httpx.TransportError:
                if time.monotonic() > deadline or monitor.poll() is not None:
                    raise SystemExit("the monitor did not start; see " + f"{workdir}/monitor.log")
                time.sleep(0.1)
        jobs = [f"load-{j}" for j in range(args.jobs)]
        for job in jobs:
            client.post(f"/jobs/{job}", json={"dp": args.ranks, "ranks_per_node": 8}).raise_for_status()
        write = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--writer", "--store", store,
                                  "--jobs", str(args.jobs), "--ranks", str(args.ranks), "--duration",
                                  str(args.duration), "--stragglers", str(args.stragglers), "--slow-from",
                                  str(args.slow_from)], cwd=REPO, stdout=subprocess.PIPE, text=True)
        kinds = ("GET /{job}", "GET /{job}", "GET /jobs", "GET /", "GET /metrics")
        latencies: dict[str, list] = {kind: [] for kind in kinds}
        stop = threading.Event()

        def load(seed: int) -> None:
            rng = np.random.default_rng(seed)
            with httpx.Client(base_url=base, timeout=30.0) as c:
                k = seed  # the clients start at different requests of the mix
                while not stop.is_set():
                    kind = kinds[k % len(kinds)]
                    path = {"GET /{job}": f"/{jobs[int(rng.integers(len(jobs)))]}", "GET /jobs": "/jobs",
                            "GET /": "/", "GET /metrics": "/metrics"}[kind]
                    t0 = time.perf_counter()
                    c.get(path).raise_for_status()
                    latencies[kind].append(time.perf_counter() - t0)
                    k += 1
                    stop.wait(args.pause)

        threads = [threading.Thread(target=load, args=(k,), daemon=True) for k in range(args.clients)]
        for t in threads:
            t.start()
        polls = []
        end = time.monotonic() + args.duration + 1
        while time.monotonic() < end:
            last = client.get("/").json()["store"]["last_poll_s"]
            if last is not None:
                polls.append(last)
            time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=60)
        out, _ = write.communicate(timeout=120)
        written = json.loads(out)
        # analyses triggered near the end of the run may still be finishing
        deadline = time.monotonic() + 30
        results = {}
        while time.monotonic() < deadline and len(results) < args.stragglers:
            for j in range(args.stragglers):
                r = client.get(f"/jobs/load-{j}/results").json()["results"]
                if r:
                    results[j] = r[0]
            time.sleep(0.5)
        metrics = client.get("/metrics").text
        poll_sum = float(re.search(r"^straggler_monitor_poll_seconds_sum (\S+)$", metrics, re.M).group(1))
        poll_count = float(re.search(r"^straggler_monitor_poll_seconds_count (\S+)$", metrics, re.M).group(1))
        statuses = [client.get(f"/{job}").json()["status"] for job in jobs]
    finally:
        client.close()
        monitor.send_signal(signal.SIGTERM)
        monitor.wait(timeout=60)
    report = {
        "jobs": args.jobs, "ranks": args.ranks, "duration_s": args.duration, "check_interval_s": args.check_interval,
        "clients": args.clients, "cpus": {"monitor": monitor_cpus, "writer and load": other_cpus},
        "writer": written, "metrics_bytes": len(metrics.encode()),
        "poll_s": {"mean": poll_sum / poll_count if poll_count else None, "polls": int(poll_count),
                   "sampled_max": max(polls) if polls else None},
        "api_ms": {kind: {"n": len(v), "p50": percentile(v, 50), "p99": percentile(v, 99), "max": percentile(v, 100)}
                   for kind, v in latencies.items()},
        "stragglers": [{"job": f"load-{j}", "expected_rank": straggler_rank(j, args.ranks),
                        "straggler_rank": r["straggler_rank"], "straggler_node": r["straggler_node"],
                        "window": [r["window"]["first_iteration"], r["window"]["last_iteration"]],
                        "analysis_s": r["analysis_s"],
                        "answer_after_last_slow_write_s": None if written["last_slow_written"] is None
                        else r["finished_at"] - written["last_slow_written"]} for j, r in sorted(results.items())],
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))},
    }
    print(json.dumps(report, indent=1))
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()

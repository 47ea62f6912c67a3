"""Cost of the monitor's state journal per change, by number of registered jobs
(docs/MONITOR.md, "Restarts and store outages").

    .venv/bin/python benchmarks/monitor_state.py                    # 1,000 and 4,000 jobs
    .venv/bin/python benchmarks/monitor_state.py --jobs 1000 4000 16000 --samples 500

For each size: a monitor over a fresh file store with that many registered jobs (each
with a layout), then `--samples` more registrations and as many unregistrations, each
timed alone (Monitor.register / unregister: the state appended before they return), and a
restart (reading the journal and compacting it). Prints one row per size, ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time


def measure(jobs: int, samples: int) -> dict:
    from relax_straggler.common.topology import Topology
    from relax_straggler.monitor.service import Monitor, MonitorConfig

    workdir = tempfile.mkdtemp(prefix="monitor-state-")
    try:
        config = MonitorConfig(f"file://{workdir}/store", state_path=f"{workdir}/state.json",
                               max_jobs=jobs + samples)
        monitor = Monitor(config)
        layout = Topology(dp=64, pp=4, tp=8, ranks_per_node=8)
        for k in range(jobs):
            monitor.register(f"train-{k:06d}", layout)

        def timed(call, ids) -> list[float]:
            out = []
            for job in ids:
                started = time.perf_counter()
                call(job)
                out.append((time.perf_counter() - started) * 1000)
            return out

        extra = [f"extra-{k:06d}" for k in range(samples)]
        register = timed(lambda j: monitor.register(j, layout), extra)
        unregister = timed(monitor.unregister, extra)
        size = os.path.getsize(config.state_path)
        monitor.stop()
        started = time.perf_counter()
        Monitor(config).stop()
        restart_ms = (time.perf_counter() - started) * 1000
        return {"jobs": jobs, "register_median": statistics.median(register),
                "register_p99": sorted(register)[int(0.99 * (len(register) - 1))],
                "unregister_median": statistics.median(unregister), "restart": restart_ms,
                "journal_kib": size / 1024}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--jobs", type=int, nargs="+", default=[1000, 4000], help="registered jobs (default 1000 4000)")
    p.add_argument("--samples", type=int, default=200, help="timed registrations per size (default 200)")
    args = p.parse_args()
    print("| jobs | register, median ms | register, p99 ms | unregister, median ms | restart ms | journal KiB |")
    print("|---|---|---|---|---|---|")
    for jobs in args.jobs:
        r = measure(jobs, args.samples)
        print(f"| {r['jobs']:,} | {r['register_median']:.3f} | {r['register_p99']:.3f} | "
              f"{r['unregister_median']:.3f} | {r['restart']:.0f} | {r['journal_kib']:,.0f} |")


if __name__ == "__main__":
    main()

"""Whether the host's other processes leave about four cores free: `make test` runs its second
pass's two streams side by side only then (each test of up to 4 ranks has about two cores of
its own), and one after the other otherwise, so that no detection shares two cores with both
another test's ranks and its own (tests/python/conftest.py): on 2 cores, 4 ranks beside
another test's 4 delayed the confirmations the detections assert.

Usage: python tests/python/free_cores.py [MIN_FREE]
Measures, over SAMPLE_S, the idle time of the cores this process may run on (/proc/stat,
Linux), in cores, and within a CPU quota (cgroup v2 cpu.max or v1 cpu.cfs_quota_us) at most
the quota less what its cgroup used; prints it and exits 0 where it is at least MIN_FREE
(default 3.5: four cores, less a background's share), 1 otherwise, 2 for a MIN_FREE that is
not a finite number >= 0."""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

SAMPLE_S = 2.0
IDLE_FIELDS = (3, 4)  # idle, iowait: after user, nice, system in each cpuN line of /proc/stat
CGROUP = Path("/sys/fs/cgroup")


def cpu_times(cores: set[int]) -> tuple[int, int]:
    """(idle, total) clock ticks so far, summed over `cores`."""
    idle = total = 0
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
                ticks = [int(f) for f in fields[:8]]  # guest time is already in user's
                idle += sum(ticks[i] for i in IDLE_FIELDS)
                total += sum(ticks)
    return idle, total


def cpu_quota() -> Optional[tuple[float, Callable[[], float]]]:
    """(cores the quota allows, a function giving the cgroup's CPU seconds so far), or None
    without a quota."""
    v2 = CGROUP / "cpu.max"
    if v2.exists():
        quota, period = v2.read_text().split()
        if quota == "max":
            return None

        def used_v2() -> float:
            stat = dict(line.split() for line in (CGROUP / "cpu.stat").read_text().splitlines())
            return int(stat["usage_usec"]) / 1e6

        return int(quota) / int(period), used_v2
    v1 = CGROUP / "cpu" / "cpu.cfs_quota_us"
    if v1.exists() and int(v1.read_text()) > 0:
        period = int((CGROUP / "cpu" / "cpu.cfs_period_us").read_text())
        return int(v1.read_text()) / period, lambda: int((CGROUP / "cpuacct" / "cpuacct.usage").read_text()) / 1e9
    return None


def free_cores(sample_s: float = SAMPLE_S) -> float:
    """Cores idle on average over `sample_s` seconds, of those this process may run on and
    within its CPU quota."""
    cores = os.sched_getaffinity(0)
    quota = cpu_quota()
    idle0, total0 = cpu_times(cores)
    used0 = quota[1]() if quota else 0.0
    time.sleep(sample_s)
    idle1, total1 = cpu_times(cores)
    free = len(cores) * (idle1 - idle0) / max(total1 - total0, 1)
    if quota:
        free = min(free, quota[0] - (quota[1]() - used0) / sample_s)
    return free


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="Exit 0 where at least MIN_FREE cores are free, 1 otherwise.")
    parser.add_argument("min_free", nargs="?", type=float, default=3.5, metavar="MIN_FREE",
                        help="cores that must be free (default 3.5)")
    least = parser.parse_args(argv).min_free
    if not (math.isfinite(least) and least >= 0):
        parser.error(f"MIN_FREE must be a finite number >= 0, got {least}")
    free = free_cores()
    print(f"{free:.2f} of {len(os.sched_getaffinity(0))} cores free (at least {least} asked)")
    return 0 if free >= least else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

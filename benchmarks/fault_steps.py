"""What a fault of the analysis costs a training step: the faults of tests/python/test_faults.py
on 2 Gloo ranks (tests/python/workers/fault_peer.py: every step sampled, decisions every 5
steps, a side-group gather taken for stuck after 3 s), each rank's step times recorded.

    gather-fails/peer     rank 1's side-group gather of step 10 fails           (DDP, 5 ms steps)
    gather-fails/metrics  the metrics rank's                                     (DDP, 5 ms steps)
    gather-hangs/peer     rank 1's side-group gather of step 10 never finishes   (DDP, 5 ms steps)
    gather-hangs/metrics  the metrics rank's                                     (DDP, 5 ms steps)
    sink-stalls           the metrics rank's report callback blocks 30 s         (DDP, 10 ms steps)
    stop-20s/peer         rank 1 SIGSTOPped for 20 s                              (independent ranks, 10 ms steps)
    stop/metrics          the metrics rank SIGSTOPped for good                   (independent ranks)
    kill/peer             rank 1 SIGKILLed                                        (independent ranks)

Per fault and rank still running: the median step, the longest step after the first (ms)
and which step it was, their ratio, and how the analysis ended (stopped for what, or held
and resumed). For the rank the fault is on, only its steps after the fault count (a
stopped process's own stop is not the analyzer's). docs/PERFORMANCE.md ("What a fault
costs a training step") records the results.

    .venv/bin/python benchmarks/fault_steps.py [--faults gather-fails/peer ...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "python" / "workers" / "fault_peer.py"
FAULT_STEP = 10
# name: (mode, fault, faulty rank, steps, worker options, s before the stopped rank is continued)
FAULTS = {
    "gather-fails/peer": ("ddp", "gather-fails", 1, 600, ["--step-ms", "5"], None),
    "gather-fails/metrics": ("ddp", "gather-fails", 0, 600, ["--step-ms", "5"], None),
    "gather-hangs/peer": ("ddp", "gather-hangs", 1, 600, ["--step-ms", "5"], None),
    "gather-hangs/metrics": ("ddp", "gather-hangs", 0, 600, ["--step-ms", "5"], None),
    "sink-stalls": ("ddp", "sink-stalls", 0, 4000, ["--step-ms", "10"], None),
    "stop-20s/peer": ("independent", "stop", 1, 3000, ["--step-ms", "10"], 20.0),
    "stop/metrics": ("independent", "stop", 0, 300, [], None),
    "kill/peer": ("independent", "kill", 1, 300, [], None),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def is_stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] == "T"


def run(name: str) -> list[dict]:
    mode, fault, faulty, steps, extra, resume_after = FAULTS[name]
    with tempfile.TemporaryDirectory() as out:
        port = free_port()
        procs = []
        for rank in range(2):
            env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                       LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen([sys.executable, str(WORKER), out, mode, fault, str(faulty), str(steps),
                                           *extra], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        if resume_after is not None:
            while not is_stopped(procs[faulty].pid):
                time.sleep(0.05)
            time.sleep(resume_after)
            procs[faulty].send_signal(signal.SIGCONT)
        procs[1 - faulty].wait(600)
        if resume_after is not None:
            procs[faulty].wait(600)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()
        rows = []
        for rank in range(2):
            path = Path(out, f"rank{rank}.json")
            if not path.exists():
                continue
            r = json.loads(path.read_text())
            first = FAULT_STEP + 1 if rank == faulty else 1
            times = r["step_s"][first:]
            median, longest = statistics.median(times), max(times)
            held = r["counters"].get("skipped_samples", 0)
            rows.append({"fault": name, "rank": rank, "faulty": rank == faulty, "steps": len(r["step_s"]),
                         "median_ms": round(median * 1e3, 1), "max_ms": round(longest * 1e3, 1),
                         "longest_step": first + times.index(longest),
                         "max_over_median": round(longest / median, 1),
                         "stopped_by": r["stopped_by"], "skipped_samples": held,
                         "uninstall_s": round(r["uninstall_s"], 2)})
        return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--faults", nargs="+", default=list(FAULTS), choices=list(FAULTS))
    args = p.parse_args()
    for name in args.faults:
        for row in run(name):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()

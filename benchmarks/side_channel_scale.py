"""The side channel's cost against the number of ranks: measured with many processes on one
host, and the metrics rank's judge measured on synthetic rows up to 100k ranks.

Part 1 (`--procs N`, several values): N processes on this host (forked from this one, after
its imports), CPU tensors, no model. Each
initialises a Gloo default group (standing for the training group), then builds the
analyzer's side channel exactly as install() does (relax_straggler.live.side_channel.open_side_channel:
the flat SideGroupGather, or the hierarchical one with --node-size) and runs `--reports`
sampled steps: each rank joins a default-group barrier (so every gather starts together,
as ranks in lockstep do), then launches the product's gather of one payload row
(ROW_LEN + STATUS_LEN float64) and, every step, the decision broadcast
(relax_straggler.live.lockstep.LockstepChannel). Measured per rank: sockets (links to socket:[...]
in /proc/self/fd) before the side channel, after its creation and after the reports (lazy
connections open on first use), the creation's wall time and the resident memory the side
channel and its reports added (VmRSS after the reports less before the channel); on the metrics rank
the gather's latency (launch to the rows' arrival in its report-thread handle, wait()), the
CPU time the process spent meanwhile (all its threads: Gloo's receiving, the relay) and the
bytes its TCP sockets received per report (tcp_info).
--lazy sets TORCH_GLOO_LAZY_INIT=1 around the side channel's group creation
(StragglerConfig.side_lazy_init does the same in the product).

Part 2 (`--judge-ranks`): the metrics rank's work per report on synthetic rows (5 core
stages of ~40 ms, 1.5 % jitter, one rank 30 % slower in forward, run-queue waits, nodes of
8 ranks): the same calls as the report thread's Analyzer._build_report (unpack, then
Judge.report: build_report, the confirmed verdict with the default settings and the window
ensemble every 10 reports, the live what-if without per-op rows): after the first 20
reports, the mean per report, the median of the reports without the ensemble, the mean of
those with it, build_report alone (timed apart on the same rows), and the process's peak RSS.

    .venv/bin/python benchmarks/side_channel_scale.py --procs 8 32 64 [--lazy] [--node-size 8 [--fanout 8]]
    .venv/bin/python benchmarks/side_channel_scale.py --procs 0 --judge-ranks 1000 10000 100000
    .venv/bin/python benchmarks/side_channel_scale.py --procs 0 --node-size 8 --plan-ranks 128 16384 100000

docs/SCALE.md has the figures, the model fitted to them and the command.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import struct
import sys
import time
from contextlib import closing
from typing import Any, Optional

import numpy as np


def sockets() -> int:
    """Sockets this process holds open (its fds that link to socket:[inode])."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            n += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the fd of the listing itself, closed meanwhile
    return n


def tcp_received() -> int:
    """Bytes received so far on this process's open TCP sockets (the kernel's
    tcp_info.tcpi_bytes_received of each; Gloo receives with recvmsg, which /proc/self/io
    does not count)."""
    total = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        with s:
            if s.type != socket.SOCK_STREAM or s.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            try:
                info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            except OSError:
                continue
            if len(info) >= _BYTES_RECEIVED + 8:
                total += struct.unpack_from("Q", info, _BYTES_RECEIVED)[0]
    return total


_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (linux/tcp.h)


def rss_mb() -> float:
    """This process's resident memory now, MiB (/proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _rank_main(rank: int, world: int, port: int, reports: int, lazy: bool, node_size: int, fanout: int,
               out: Any) -> None:
    import torch.distributed as dist

    from relax_straggler.common.payload import ROW_LEN
    from relax_straggler.config import StragglerConfig
    from relax_straggler.live.lockstep import LockstepChannel
    from relax_straggler.live.side_channel import open_side_channel

    os.environ["LOCAL_WORLD_SIZE"] = str(node_size or world)
    os.environ["LOCAL_RANK"] = str(rank % (node_size or world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    dist.barrier()
    before, rss_before = sockets(), rss_mb()
    config = StragglerConfig(enabled=True, side_lazy_init=lazy, side_node_size=node_size, side_fanout=fanout)
    t0 = time.perf_counter()
    gather = open_side_channel(list(range(world)), config)
    created_s = time.perf_counter() - t0
    dist.barrier()
    created = sockets()
    lockstep = LockstepChannel(gather.group, gather.metrics_global_rank, rank, None, 1)
    row = np.full(ROW_LEN, 1.0)
    latencies, read, cpu = [], [], []
    for step in range(reports):
        dist.barrier()
        r0 = tcp_received() if rank == 0 else 0
        t0, c0 = time.perf_counter(), time.process_time()
        pending = gather.gather(row, None, step)
        if pending is not None:
            pending.wait()
            latencies.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            read.append(tcp_received() - r0)
        lockstep.at_step(step, lambda: (False, None), 1.0)
        gather.poll()
    dist.barrier()
    after, rss_after = sockets(), rss_mb()
    lockstep.close(5.0)
    clean = gather.close(5.0)
    out.put({"rank": rank, "before": before, "created": created, "after": after, "created_s": created_s,
             "rss_mb": rss_after - rss_before, "latencies": latencies,
             "read": read, "cpu": cpu, "clean": clean,
             "failure": None if gather.failure is None else gather.failure.describe()})
    dist.destroy_process_group()


def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_procs(world: int, reports: int, lazy: bool, node_size: int, fanout: int,
              timeout_s: float) -> dict[str, Any]:
    """Runs `world` ranks and summarises what they measured (see the module docstring)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("fork")  # the ranks share the parent's imports: 64 start in seconds, not minutes
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, world, port, reports, lazy, node_size, fanout, out)) for r in range(world)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    results = []
    deadline = time.monotonic() + timeout_s
    while len(results) < world and time.monotonic() < deadline:
        try:
            results.append(out.get(timeout=1.0))
        except Exception:
            if all(p.exitcode not in (None, 0) for p in procs if p.exitcode is not None) and \
                    any(p.exitcode not in (None, 0) for p in procs):
                break
    for p in procs:
        p.join(timeout=max(deadline - time.monotonic(), 1.0))
        if p.is_alive():
            p.kill()
    if len(results) < world:
        raise RuntimeError(f"{world} ranks: only {len(results)} reported (exit codes {[p.exitcode for p in procs]})")
    results.sort(key=lambda r: r["rank"])
    side = [r["created"] - r["before"] for r in results]
    used = [r["after"] - r["before"] for r in results]
    lat = results[0]["latencies"][2:]  # the first gathers open lazy connections
    return {
        "ranks": world, "lazy": lazy, "node_size": node_size, "fanout": fanout, "wall_s": time.perf_counter() - t0,
        "side_sockets_created": [min(side), statistics.median(side), max(side)],
        "side_sockets_used": [min(used), statistics.median(used), max(used)],
        "metrics_rank_sockets_used": used[0],
        "other_ranks_sockets_used_max": max(used[1:]),
        "create_s": [min(r["created_s"] for r in results), statistics.median(r["created_s"] for r in results),
                     max(r["created_s"] for r in results)],
        "gather_ms": [1e3 * statistics.median(lat), 1e3 * float(np.percentile(lat, 90))],
        "first_gather_ms": 1e3 * results[0]["latencies"][0],
        "metrics_cpu_ms": 1e3 * statistics.median(results[0]["cpu"][2:]),
        "read_bytes_per_report": statistics.median(results[0]["read"][2:]),
        "side_rss_mb": [min(r["rss_mb"] for r in results), statistics.median(r["rss_mb"] for r in results),
                        max(r["rss_mb"] for r in results)],
        "failures": [r["failure"] for r in results if r["failure"]],
        "unclean": sum(not r["clean"] for r in results),
    }


def planned_connections(ranks: int, node_size: int, fanout: int, lazy: bool) -> dict[str, int]:
    """Peers each rank connects to in the hierarchical channel's gathers, from its plan
    (relax_straggler.live.side_tree.plan), and the Gloo groups it is in (each listens on one
    socket; the decisions' group is one more): {"metrics_rank": peers, "other_max": the most
    any other rank has, "groups_max": groups}. Eager groups connect every pair; lazy ones
    only what a gather uses (a member its root, a root its members)."""
    from relax_straggler.live.side_tree import plan

    peers = [0] * ranks
    groups = [1] * ranks  # the decisions' group
    for level in plan(range(ranks), 0, node_size, fanout):
        for g in level:
            for m in g.members:
                groups[m] += 1
                peers[m] += len(g.members) - 1 if (not lazy or m == g.root) else 1
    return {"metrics_rank": peers[0], "other_max": max(peers[1:]), "groups_max": max(groups)}


def _synthetic(ranks: int, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """(base rows (ranks, ROW_LEN), column index of each core stage's device and host ms)."""
    from relax_straggler.common.payload import FIELDS, HEADER, pack
    from relax_straggler.common.stages import STAGE_IDS, STAGES

    core_stages = ("forward", "backward", "optimizer", "communication", "data")
    device = np.full(len(STAGES), np.nan)
    for s in core_stages:
        device[STAGE_IDS[s]] = 40.0
    zeros = np.where(np.isnan(device), np.nan, 0.0)
    base = pack(0, np.nan, 0, device, device, zeros, np.where(np.isnan(device), np.nan, 1.0), (), None, 0.0,
                run_queue_ms=1.0)
    rows = np.tile(base, (ranks, 1))
    rows[:, 2] = np.arange(ranks)
    cols = np.array([len(HEADER) + STAGE_IDS[s] * len(FIELDS) + f for s in core_stages for f in (0, 1)])
    return rows, cols


def judge_us(ranks: int, reports: int, seed: int = 0) -> dict[str, float]:
    """Mean us per report of the report thread's judging at `ranks` synthetic ranks."""
    from relax_straggler import StragglerConfig
    from relax_straggler.common.payload import unpack
    from relax_straggler.judge import Judge
    from relax_straggler.judge.report import build_report

    rng = np.random.default_rng(seed)
    base, cols = _synthetic(ranks, rng)
    config = StragglerConfig(enabled=True)
    judge = Judge(config, [r // 8 for r in range(ranks)])
    no_ops = np.empty((ranks, 0))
    times, builds, windowed = [], [], []
    for step in range(reports):
        rows = base.copy()
        rows[:, 0] = step
        rows[:, 5] = step
        rows[:, cols] *= np.exp(0.015 * rng.standard_normal((ranks, len(cols))))
        rows[7, cols[:2]] *= 1.3
        rows[:, 6] = rng.exponential(1.0, ranks)
        t0 = time.perf_counter()
        build_report(unpack(rows), step, config, 0, {})  # timed apart: the judge builds its own
        t1 = time.perf_counter()
        report = judge.report(unpack(rows), no_ops, step, {})
        if report.verdict.window is not None:
            windowed.append(step)
        times.append(time.perf_counter() - t1)
        builds.append(t1 - t0)
    skip = min(reports // 2, 20)
    plain = [t for i, t in enumerate(times) if i >= skip and i not in windowed]
    window = [times[i] for i in windowed if i >= skip]
    return {"ranks": ranks, "mean_report_us": 1e6 * float(np.mean(times[skip:])),
            "median_report_us": 1e6 * float(np.median(plain)), "build_report_us": 1e6 * float(np.median(builds[skip:])),
            "window_report_us": 1e6 * float(np.mean(window)) if window else None,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, nargs="+", default=[8, 32], help="ranks per run (0: none)")
    p.add_argument("--reports", type=int, default=30)
    p.add_argument("--lazy", action="store_true", help="TORCH_GLOO_LAZY_INIT for the side channel's groups")
    p.add_argument("--node-size", type=int, default=0, help="hierarchical side channel, nodes of this many ranks")
    p.add_argument("--judge-ranks", type=int, nargs="*", default=[])
    p.add_argument("--judge-reports", type=int, default=40)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--fanout", type=int, default=8, help="the hierarchical channel's leaders per group")
    p.add_argument("--plan-ranks", type=int, nargs="*", default=[],
                   help="print the hierarchical channel's planned connections at these sizes (--node-size, --fanout)")
    args = p.parse_args(argv)
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for world in [w for w in args.procs if w > 0]:
        print(json.dumps(run_procs(world, args.reports, args.lazy, args.node_size, args.fanout, args.timeout)),
              flush=True)
    for ranks in args.plan_ranks:
        for lazy in (False, True):
            print(json.dumps({"ranks": ranks, "node_size": args.node_size, "fanout": args.fanout, "lazy": lazy,
                              **planned_connections(ranks, args.node_size, args.fanout, lazy)}), flush=True)
    for ranks in args.judge_ranks:
        print(json.dumps(judge_us(ranks, args.judge_reports)), flush=True)
    print(f"# load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    sys.exit(main())

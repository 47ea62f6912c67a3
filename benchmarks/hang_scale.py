"""The hang watchdog's c10d-store traffic against the number of ranks.

At a hang every rank writes one snapshot into the job's TCPStore and the answering rank
reads them all and compares them (relax_straggler.hang). Measured here with the product's
StoreChannel over a local TCPStore (one client writes the N snapshots in turn, standing for
N ranks) and the product's diagnose: the bytes one snapshot takes in the store, the time a
rank spends writing its own, the answering rank's full read (two calls when all are in:
one check, one multi_get) and the comparison. Each rank's snapshot names three groups as a
Megatron job has them: the world, its data-parallel group (every 8th rank) and its tensor-
parallel group (8 consecutive ranks); rank 5 never entered its data-parallel group's newest
all-reduce, which the answer must name.

With --writers P the N snapshots are written at once by P processes, each with its own
store client writing its share in turn, as the ranks of a stopped job do: the time until
all N are in, each write's latency, and the part of it spent in the store's two calls (set
and add; the rest is the writer's own encoding, O(its groups' sizes), which at scale every
rank does on its own host at once), the store's server taking every client at once.

    .venv/bin/python benchmarks/hang_scale.py --ranks 1000 4000 16000 [--diagnose-ranks 100000]
    .venv/bin/python benchmarks/hang_scale.py --ranks 4000 16000 --writers 64 --diagnose-ranks

docs/SCALE.md has the figures and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import time
from typing import Any, Optional

import torch.distributed as dist

from relax_straggler.hang.channel import StoreChannel
from relax_straggler.hang.diagnose import diagnose

TP = 8
SLOW = 5


def snapshot(rank: int, n: int, wall: float) -> dict[str, Any]:
    """Rank `rank`'s snapshot in a job of n ranks (n a multiple of TP)."""
    def at(seq: int, ago_s: float = 30.0) -> dict[str, Any]:
        return {"seq": seq, "op": "all_reduce", "ago_s": ago_s}

    dp_seq = 99 if rank == SLOW else 100  # the others wait in #100, entered last
    tp0 = rank // TP * TP
    groups = [{"name": "0", "desc": "default_pg", "ranks": range(n), "collective": at(3, 300.0), "p2p": None,
               "completed": at(3, 300.0)},
              {"name": f"dp{rank % TP}", "desc": "dp", "ranks": range(rank % TP, n, TP), "collective": at(dp_seq),
               "p2p": None, "completed": at(99)},
              {"name": f"tp{tp0}", "desc": "tp", "ranks": range(tp0, tp0 + TP), "collective": at(500, 60.0),
               "p2p": None, "completed": at(500, 60.0)}]
    return {"rank": rank, "step": 41, "wall": wall, "stalled_s": 30.0, "groups": groups, "analyzer": None}


def store_run(n: int) -> dict[str, Any]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=60))
    channel = StoreChannel(lambda: server, f"bench/{n}/")
    wall = time.time()
    t0 = time.perf_counter()
    for r in range(n):
        channel.put_snapshot(r, snapshot(r, n, wall))
    put_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    snaps = channel.snapshots(list(range(n)))
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    answer = diagnose(snaps, range(n), now=wall + 1)
    diagnose_s = time.perf_counter() - t0
    assert answer.findings and answer.findings[0].rank == SLOW, answer.text()
    return {"ranks": n, "snapshot_bytes": len(server.get(f"bench/{n}/snapshot/{SLOW}")),
            "put_us_per_rank": round(put_s / n * 1e6, 1), "read_all_s": round(read_s, 3),
            "diagnose_s": round(diagnose_s, 3), "answer_chars": len(answer.text())}


class _TimedStore:
    """A store client that adds up the time its set and add calls take."""

    def __init__(self, store: Any) -> None:
        self.store, self.spent_s = store, 0.0

    def set(self, key: str, value: str) -> None:
        t0 = time.perf_counter()
        self.store.set(key, value)
        self.spent_s += time.perf_counter() - t0

    def add(self, key: str, amount: int) -> int:
        t0 = time.perf_counter()
        value = self.store.add(key, amount)
        self.spent_s += time.perf_counter() - t0
        return value


def _writer(port: int, prefix: str, ranks: range, n: int, wall: float, barrier, out) -> None:
    """One process of concurrent_run: its own client, its share of the snapshots in turn;
    puts (each write's latency, its time in the store's calls) and its end time."""
    client = _TimedStore(dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=120)))
    channel = StoreChannel(lambda: client, prefix)
    snaps = [(r, snapshot(r, n, wall)) for r in ranks]
    barrier.wait()
    latencies = []
    for r, snap in snaps:
        t0, before = time.perf_counter(), client.spent_s
        channel.put_snapshot(r, snap)
        latencies.append((time.perf_counter() - t0, client.spent_s - before))
    out.put((latencies, time.time()))


def concurrent_run(n: int, writers: int) -> dict[str, Any]:
    """n snapshots written at once by `writers` processes (module docstring), then read and
    compared as in store_run."""
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=120))
    prefix, wall = f"bench/{n}/{writers}/", time.time()
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(writers + 1), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(server.port, prefix, range(w, n, writers), n, wall, barrier, out))
             for w in range(writers)]
    for proc in procs:
        proc.start()
    barrier.wait()
    start = time.time()
    results = [out.get(timeout=600) for _ in procs]
    for proc in procs:
        proc.join()
    latencies = sorted(total for lat, _ in results for total, _ in lat)
    in_store = sorted(store for lat, _ in results for _, store in lat)
    all_in_s = max(end for _, end in results) - start
    channel = StoreChannel(lambda: server, prefix)
    t0 = time.perf_counter()
    snaps = channel.snapshots(list(range(n)))
    read_s = time.perf_counter() - t0
    answer = diagnose(snaps, range(n), now=wall + 1)
    assert answer.findings and answer.findings[0].rank == SLOW, answer.text()
    return {"ranks": n, "writers": writers, "all_in_s": round(all_in_s, 3),
            "write_ms_median": round(statistics.median(latencies) * 1e3, 2),
            "write_ms_p99": round(latencies[int(0.99 * (len(latencies) - 1))] * 1e3, 2),
            "write_ms_max": round(latencies[-1] * 1e3, 2),
            "store_ms_median": round(statistics.median(in_store) * 1e3, 2),
            "store_ms_p99": round(in_store[int(0.99 * (len(in_store) - 1))] * 1e3, 2), "read_all_s": round(read_s, 3)}


def diagnose_run(n: int) -> dict[str, Any]:
    """The comparison alone on n in-memory snapshots, their groups' ranks shared as the
    channel's read shares them."""
    shared: dict[tuple, tuple[int, ...]] = {}
    snaps = {}
    for r in range(n):
        s = snapshot(r, n, 0.0)
        for g in s["groups"]:
            key = (g["ranks"].start, g["ranks"].stop, g["ranks"].step)
            if key not in shared:
                shared[key] = tuple(g["ranks"])
            g["ranks"] = shared[key]
        snaps[r] = s
    t0 = time.perf_counter()
    answer = diagnose(snaps, range(n), now=1.0)
    return {"ranks": n, "diagnose_s": round(time.perf_counter() - t0, 3), "answer_chars": len(answer.text()),
            "first_finding_rank": answer.findings[0].rank}


def main(argv: Optional[list[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, nargs="*", default=[1000, 4000, 16000],
                   help="jobs measured through the store (multiples of 8)")
    p.add_argument("--diagnose-ranks", type=int, nargs="*", default=[100_000],
                   help="jobs whose comparison alone is measured (multiples of 8)")
    p.add_argument("--writers", type=int, default=0,
                   help="processes writing the snapshots at once (0: one client writes them in turn)")
    args = p.parse_args(argv)
    print(f"# load average at start: {os.getloadavg()}", flush=True)
    for n in args.ranks:
        print(json.dumps(concurrent_run(n, args.writers) if args.writers > 0 else store_run(n)), flush=True)
    for n in args.diagnose_ranks:
        print(json.dumps(diagnose_run(n)), flush=True)
    print(f"# load average at end: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()

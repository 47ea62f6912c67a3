"""The channel the watchdogs publish through while training is stuck: the job's c10d
store (the TCPStore torch.distributed rendezvoused on), not any process group, so a
stuck or broken group cannot block it.

Keys live under ``relax_straggler/hang/<job>/`` (job: the launcher's run id and restart
count): ``snapshot/<rank>`` per rank, ``answer``, and ``claim`` (taken by the rank that
answers for a stopped metrics rank, released when steps end again), and ``snapshots``, the
count of snapshots written and not removed, which the answering rank polls instead of
reading every snapshot while it waits for them. A group's ranks travel as arithmetic runs
(relax_straggler.hang.rank_runs), so a snapshot's size does not grow with the job's.
Over TCP the channel opens its own
client connection, at the first hang, with its own timeout: every call returns or raises
within timeout_s and the training's store client is untouched.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
from typing import Any, Callable, Optional

import torch.distributed as dist

from relax_straggler.hang.rank_runs import from_runs, to_runs


def job_prefix() -> str:
    """``relax_straggler/hang/<run id>/<restart>/`` from torchrun's environment ("local/0" without)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID") or "local"
    return f"relax_straggler/hang/{run}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


class StoreChannel:
    """Snapshots and the answer in a c10d store. connect() returns the store to use (called
    once, lazily, on the first call). Every method raises RuntimeError (or what the store
    raises) when the store cannot be reached within the store's timeout."""

    def __init__(self, connect: Callable[[], Any], prefix: str) -> None:
        self._connect = connect
        self._store: Any = None
        self._lock = threading.Lock()
        self.prefix = prefix

    @classmethod
    def from_default_group(cls, timeout_s: float) -> Optional["StoreChannel"]:
        """The channel over torch.distributed's default store: a new client of its TCPStore
        with timeout_s, or the store itself when it is not TCP (a file or hash store, whose
        calls are local). None when torch.distributed has no default store."""
        try:
            store = dist.distributed_c10d._get_default_store()
        except (RuntimeError, AttributeError, ValueError):
            return None
        base = store
        while not isinstance(base, dist.TCPStore) and hasattr(base, "underlying_store"):
            base = base.underlying_store
        if isinstance(base, dist.TCPStore):
            host, port = base.host, base.port

            def connect() -> Any:
                return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                                     wait_for_workers=False)
        else:
            def connect() -> Any:
                return store
        return cls(connect, job_prefix())

    def _get_store(self) -> Any:
        with self._lock:
            if self._store is None:
                self._store = self._connect()
            return self._store

    def put_snapshot(self, rank: int, snapshot: dict[str, Any]) -> None:
        """Writes this rank's snapshot (its groups' "ranks" as runs), then counts it."""
        groups = [{**{k: v for k, v in g.items() if k != "ranks"}, "rank_runs": to_runs(g["ranks"])}
                  for g in snapshot["groups"]]
        store = self._get_store()
        store.set(self._key(rank), json.dumps({**snapshot, "groups": groups}))
        store.add(f"{self.prefix}snapshots", 1)

    def delete_snapshot(self, rank: int) -> None:
        store = self._get_store()
        if store.delete_key(self._key(rank)):
            store.add(f"{self.prefix}snapshots", -1)

    def published(self) -> int:
        """How many snapshots are in the store now (written and not removed): one call."""
        return int(self._get_store().add(f"{self.prefix}snapshots", 0))

    def snapshots(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """The snapshots present now among `ranks` (never waits for a missing one), each
        group's ranks as a tuple shared by every snapshot that names the same runs; an
        unreadable value is skipped. Two store calls when all are present, else two a rank."""
        store = self._get_store()
        keys = [self._key(r) for r in ranks]
        if keys and store.check(keys):
            values = dict(zip(ranks, store.multi_get(keys)))
        else:
            values = {r: store.get(k) for r, k in zip(ranks, keys) if store.check([k])}
        shared: dict[str, tuple[int, ...]] = {}
        out = {}
        for rank, value in values.items():
            try:
                snap = json.loads(value)
                for g in snap["groups"]:
                    runs = g.pop("rank_runs")
                    key = json.dumps(runs)
                    if key not in shared:
                        shared[key] = from_runs(runs)
                    g["ranks"] = shared[key]
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            out[rank] = snap
        return out

    def _key(self, rank: int) -> str:
        return f"{self.prefix}snapshot/{rank}"

    def claim(self) -> bool:
        """Whether this caller is the first to claim the current hang (an atomic add)."""
        return int(self._get_store().add(f"{self.prefix}claim", 1)) == 1

    def release_claim(self) -> None:
        self._get_store().delete_key(f"{self.prefix}claim")

    def put_answer(self, answer: dict[str, Any]) -> None:
        self._get_store().set(f"{self.prefix}answer", json.dumps(answer))

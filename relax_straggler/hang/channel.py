"""The channel the watchdogs publish through while training is stuck: the job's c10d
store (the TCPStore torch.distributed rendezvoused on), not any process group, so a
stuck or broken group cannot block it.

Keys live under ``relax_straggler/hang/<job>/`` (job: the launcher's run id and restart
count): ``snapshot/<rank>`` per rank, ``answer``, and ``claim`` (taken by the rank that
answers for a stopped metrics rank, released when steps end again). Over TCP the channel opens its own
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
        self._get_store().set(f"{self.prefix}snapshot/{rank}", json.dumps(snapshot))

    def delete_snapshot(self, rank: int) -> None:
        self._get_store().delete_key(f"{self.prefix}snapshot/{rank}")

    def snapshots(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """The snapshots present now among `ranks` (never waits for a missing one); an
        unreadable value is skipped."""
        store = self._get_store()
        out = {}
        for rank in ranks:
            key = f"{self.prefix}snapshot/{rank}"
            if not store.check([key]):
                continue
            try:
                out[rank] = json.loads(store.get(key))
            except ValueError:
                continue
        return out

    def claim(self) -> bool:
        """Whether this caller is the first to claim the current hang (an atomic add)."""
        return int(self._get_store().add(f"{self.prefix}claim", 1)) == 1

    def release_claim(self) -> None:
        self._get_store().delete_key(f"{self.prefix}claim")

    def put_answer(self, answer: dict[str, Any]) -> None:
        self._get_store().set(f"{self.prefix}answer", json.dumps(answer))

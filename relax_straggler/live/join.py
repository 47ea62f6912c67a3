"""A bounded meeting of every rank at install() and uninstall(), over the job's c10d store.

install() creates the side group, a collective of the default group that waits (Gloo's
30 min) for a rank that never calls it. Before it, each rank checks in here: when every
rank of the default group has checked in, all go on; when one has not within timeout_s,
the meeting is called off and every rank that came (then or later) is told which ranks are
missing, so no rank enters the collective alone.

The rule: each arrival adds 1 to a counter; the arrival that completes it writes
"complete" into the meeting's state key; a rank whose wait ends first writes "abandoned"
and its rank.
The state is written once (compare-and-set), so every rank reads the same outcome.

The meeting talks to the store through a client of its own whose every call gives up after
a fraction of timeout_s: a store whose host rank has exited (at uninstall) costs that
fraction, not the job's store timeout (minutes).
"""

from __future__ import annotations

import datetime
import itertools
import os
import time
from typing import Any, Optional

import torch.distributed as dist

_POLL_S = 0.02
_SHOWN = 8  # missing ranks named in a message
_COMPLETE, _ABANDONED = b"complete", b"abandoned"
_meetings: dict[str, itertools.count] = {}  # what -> this process's count of its meetings


class JoinTimeout(RuntimeError):
    """Not every rank of the job reached the same install() / uninstall() in time."""


def meet(what: str, timeout_s: float, store: Optional[Any] = None) -> None:
    """Waits until every rank of the default group has called meet(what) as many times as
    this one, at most timeout_s seconds. what: the call named in the error ("install()").
    store: the c10d store (default: a client of torch.distributed's, see _client). Raises JoinTimeout naming `what`,
    the ranks that came and some that did not; returns at once without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    store = store if store is not None else _client(min(10.0, max(0.5, timeout_s / 4)))
    rank, world = dist.get_rank(), dist.get_world_size()
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID') or 'local'}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    key = f"relax_straggler/meet/{run}/{what}/{next(_meetings.setdefault(what, itertools.count()))}"
    store.set(f"{key}/rank/{rank}", b"1")
    if store.add(f"{key}/count", 1) == world:
        store.compare_set(f"{key}/state", b"", _COMPLETE)
    deadline = time.monotonic() + timeout_s
    while not store.check([f"{key}/state"]) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    state = store.compare_set(f"{key}/state", b"", _ABANDONED + b" %d" % rank)  # written now if still unset
    if state == _COMPLETE:
        return
    missing = []
    for r in range(world):
        if not store.check([f"{key}/rank/{r}"]):
            missing.append(r)
            if len(missing) > _SHOWN:
                break
    rule = (f"{what} is collective: every rank of the job calls it at the same point "
            f"(--straggler-join-timeout / StragglerConfig.join_timeout_s sets the wait)")
    if not missing:  # everyone came, but one rank had stopped waiting before the last came
        who = state.decode().split()[-1]
        raise JoinTimeout(f"relax_straggler.{what} was called on every rank, but rank {who} stopped waiting after "
                          f"{timeout_s:g} s before all came; {rule}")
    came = int(store.add(f"{key}/count", 0))
    named = ", ".join(map(str, missing[:_SHOWN])) + (", ..." if len(missing) > _SHOWN else "")
    raise JoinTimeout(f"relax_straggler.{what} was called on {came} of {world} ranks within {timeout_s:g} s (rank "
                      f"{rank} waited), not on rank(s) {named}; {rule}")


def _client(call_timeout_s: float) -> Any:
    """A new client of the default group's TCPStore whose calls give up after
    call_timeout_s, or the default store itself when it is not TCP (a file or hash store:
    its calls are local)."""
    store = dist.distributed_c10d._get_default_store()
    base = store
    while not isinstance(base, dist.TCPStore) and hasattr(base, "underlying_store"):
        base = base.underlying_store
    if not isinstance(base, dist.TCPStore):
        return store
    return dist.TCPStore(base.host, base.port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=call_timeout_s))

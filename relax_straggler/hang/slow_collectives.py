"""Which rank held each collective back, from the durations in Flight Recorder dumps: the
evidence beside the hang answer, never part of it.

A dump has duration_ms for the collectives that completed while timing was on
(TORCH_NCCL_ENABLE_TIMING=1, the device time between the op's start and end events). A
collective's duration includes waiting for its peers, so the rank that arrived last has the
SHORTEST duration and the earliest the longest (docs/ARCHITECTURE.md invariant 7): the
spread, longest minus shortest, is what the others waited for it. Entry times
(time_created_ns) are each host's wall clock, so "entered last" across hosts is only as good
as their clock sync; the durations are each rank's own.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Optional

from relax_straggler.hang.diagnose import label

if TYPE_CHECKING:
    from relax_straggler.hang.fr_dumps import Dump

ROWS = 10  # the widest spreads shown


def slow_collectives(dumps: dict[int, "Dump"], rows: int = ROWS) -> Optional[dict[str, Any]]:
    """None when no collective has durations on two ranks; else {"collectives": how many
    have, "rows": the `rows` with the widest spread (group, seq, op, ranks, last_entered,
    entered_late_ms, longest_rank, longest_ms, shortest_rank, shortest_ms, spread_ms),
    "ranks": per rank how often it entered last and how often it had the shortest duration
    (ranks named at least once, most often first)}. Times in ms."""
    timed: dict[tuple[str, int], dict[int, Any]] = {}
    for rank, d in dumps.items():
        for e in d.entries:
            if e.is_p2p or e.duration_ms is None:
                continue
            per_rank = timed.setdefault((e.group, e.seq), {})
            if rank not in per_rank or e.record_id > per_rank[rank].record_id:  # coalesced: the last op
                per_rank[rank] = e
    table = []
    last, shortest = Counter(), Counter()
    for (group, seq), per_rank in timed.items():
        if len(per_rank) < 2:
            continue
        first = min(per_rank.values(), key=lambda e: e.created_ns).created_ns
        late_rank = max(per_rank, key=lambda r: (per_rank[r].created_ns, r))
        long_rank = max(per_rank, key=lambda r: (per_rank[r].duration_ms, -r))
        short_rank = min(per_rank, key=lambda r: (per_rank[r].duration_ms, r))
        e = per_rank[late_rank]
        last[late_rank] += 1
        shortest[short_rank] += 1
        table.append({"group": label({"name": group, "desc": e.desc}), "seq": seq, "op": e.op,
                      "ranks": len(per_rank), "last_entered": late_rank,
                      "entered_late_ms": (e.created_ns - first) / 1e6,
                      "longest_rank": long_rank, "longest_ms": per_rank[long_rank].duration_ms,
                      "shortest_rank": short_rank, "shortest_ms": per_rank[short_rank].duration_ms,
                      "spread_ms": per_rank[long_rank].duration_ms - per_rank[short_rank].duration_ms})
    if not table:
        return None
    table.sort(key=lambda row: (-row["spread_ms"], row["group"], row["seq"]))
    ranks = sorted(set(last) | set(shortest), key=lambda r: (-(last[r] + shortest[r]), r))
    return {"collectives": len(table), "rows": table[:rows],
            "ranks": [{"rank": r, "entered_last": last[r], "shortest": shortest[r]} for r in ranks]}

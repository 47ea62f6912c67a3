"""The steps the what-if replay can model: the engine needs every dp_rank of every step to
run the same ops (stage, op type, seq_id), each once. A row a reader skipped (a bad value,
a duplicate) leaves its step short of an op; that step is left out of the replay and
reported, and the others are replayed. A dp_rank is never left out: a replay without one
models a job with fewer replicas, whose slowdown is not the recorded job's, so a dp_rank
complete in no step refuses the input. One sort of an 8-byte key per record, in place; the
other passes go a chunk of records at a time, so a large trace's memory grows by those 8
bytes a record only."""

from __future__ import annotations

import numpy as np

from relax_straggler.readers import OpRecords, Problems
from relax_straggler.readers.op_trace import row_keys
from relax_straggler.whatif.errors import WhatIfInputError

_FIELDS = ("dp_rank", "stage", "step", "optype", "start", "duration", "seq_id", "microbatch", "chunk", "rank")


# Records per pass: the temporaries of a pass stay within tens of MB at any trace size.
_CHUNK = 1 << 20


def chunks(n: int):
    """Slices of _CHUNK records covering n records: the passes of the checks before the replay."""
    return (slice(lo, min(lo + _CHUNK, n)) for lo in range(0, n, _CHUNK))


def _op_keys(rec: OpRecords, part: slice) -> np.ndarray:
    """The op (stage, op type, seq_id) of each record of `part` as a 64-bit key."""
    return row_keys(rec.stage[part].astype(np.int64), rec.optype[part].astype(np.int64),
                    rec.seq_id[part].astype(np.int64))


def _groups(rec: OpRecords) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per (step, dp_rank) group that has records, in step then dp_rank order: its step, its
    dp_rank, its op count, the wrapping sum of its op keys (an order-free fingerprint of its
    op set) and whether it records an op twice. Each record becomes one int64, its group
    index times the number of distinct ops plus its op's index, sorted in place: a group's
    records are then contiguous and a repeated op is a repeated key."""
    n = len(rec)
    parts = list(chunks(n))

    def distinct_of(column) -> np.ndarray:
        return distinct(np.concatenate([distinct(column(p)) for p in parts]))

    steps = distinct_of(lambda p: rec.step[p])
    dps = distinct_of(lambda p: rec.dp_rank[p])
    ops = distinct_of(lambda p: _op_keys(rec, p))

    def group_of(p: slice) -> np.ndarray:  # (step, dp_rank) as one int64, in step then dp_rank order
        return np.searchsorted(steps, rec.step[p]) * dps.size + np.searchsorted(dps, rec.dp_rank[p])

    groups = distinct_of(group_of)  # those with records: at most one a record
    key = np.empty(n, dtype=np.int64)
    for p in parts:
        key[p] = np.searchsorted(groups, group_of(p)) * ops.size + np.searchsorted(ops, _op_keys(rec, p))
    key.sort()
    count = np.zeros(groups.size, dtype=np.int64)
    total = np.zeros(groups.size, dtype=np.uint64)
    repeated = np.zeros(groups.size, dtype=bool)
    op_sum = ops.view(np.uint64)
    for p in parts:
        k = key[p]
        g = k // ops.size
        count += np.bincount(g, minlength=groups.size)
        with np.errstate(over="ignore"):
            np.add.at(total, g, op_sum[k % ops.size])  # wraps, as the fingerprint should
        prev = key[max(p.start - 1, 0):p.stop - 1]  # the key before each record (none before the first)
        tail = k.size - prev.size
        repeated[g[tail:][k[tail:] == prev]] = True
    return steps[groups // dps.size], dps[groups % dps.size], count, total, repeated


def complete_steps(rec: OpRecords, problems: Problems) -> OpRecords:
    """rec without the steps where some dp_rank does not run the ops most (step, dp_rank)
    groups run; each left out step is reported through `problems` (kind "whatif_left_out";
    strict raises InputError). Raises WhatIfInputError naming the file when a dp_rank runs
    those ops in no step, or no step is left."""
    if not len(rec):
        return rec
    g_step, g_dp, count, total, repeated = _groups(rec)
    clean = np.flatnonzero(~repeated)
    if clean.size == 0:
        raise WhatIfInputError(f"{problems.path}: every step records an op twice on some dp_rank; nothing to replay")
    prints = row_keys(count[clean].astype(np.int64), total[clean].view(np.int64))
    by_print = np.argsort(prints, kind="stable")
    runs = np.flatnonzero(np.r_[True, prints[by_print][1:] != prints[by_print][:-1]])
    freq, first = np.diff(np.r_[runs, prints.size]), clean[by_print[runs]]
    # The most frequent op set; on a tie the larger one (a skipped row takes ops away), then the earliest.
    best = first[np.lexsort((first, -count[first], -freq))[0]]
    good = ~repeated & (count == count[best]) & (total == total[best])
    want_count = int(count[best])

    dps = distinct(g_dp)
    first = f"; first problem: {problems.kept[0]}" if problems.kept else ""
    never = dps[~_member(dps, distinct(g_dp[good]))]
    if never.size:
        raise WhatIfInputError(f"{problems.path}: dp_rank {int(never[0])} runs the ops of the other dp_ranks in no "
                               f"step, and a replay without it would model a job of {dps.size - never.size} dp_ranks, "
                               f"not the recorded {dps.size}{first}")
    steps = distinct(g_step)
    complete = np.bincount(np.searchsorted(steps, g_step[good]), minlength=steps.size) == dps.size
    for i in np.flatnonzero(~complete).tolist():
        mine = g_step == steps[i]
        why = _why(g_dp[mine], count[mine], repeated[mine], good[mine], dps, want_count)
        problems.report(0, f"step {int(steps[i])} left out of the what-if replay: {why} (see the rows skipped "
                           "above)", "whatif_left_out", skipped=0)
    if not complete.any():
        raise WhatIfInputError(f"{problems.path}: no step runs the same ops on every dp_rank, so no step can be "
                               f"replayed{first}")
    if complete.all():
        return rec
    keep = np.concatenate([_member(rec.step[p], steps[complete]) for p in chunks(len(rec))])
    return OpRecords(*(getattr(rec, f)[keep] for f in _FIELDS[:9]), optype_names=rec.optype_names,
                     rank=rec.rank[keep], left_out_steps=steps[~complete].tolist())


# Sort-based set operations: np.unique / np.isin / setdiff1d import numpy.ma for some dtypes,
# which a what-if run does not otherwise pay for (tests/python/test_whatif_imports.py).
def distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a."""
    a = np.sort(a)
    return a[np.r_[True, a[1:] != a[:-1]]] if a.size else a


def _member(a: np.ndarray, sorted_b: np.ndarray) -> np.ndarray:
    """(a.shape) bool: each value of a is in the sorted array sorted_b."""
    if not sorted_b.size:
        return np.zeros(a.shape, dtype=bool)
    i = np.minimum(np.searchsorted(sorted_b, a), sorted_b.size - 1)
    return sorted_b[i] == a


def _why(dp: np.ndarray, count: np.ndarray, repeated: np.ndarray, good: np.ndarray, dps: np.ndarray,
         want: int) -> str:
    """Why one step is incomplete: its first dp_rank without the expected ops."""
    missing = dps[~_member(dps, distinct(dp))]
    if missing.size:
        return f"dp_rank {int(missing[0])} records no op in it"
    i = int(np.flatnonzero(~good)[0])
    if repeated[i]:
        return f"dp_rank {int(dp[i])} records an op twice"
    return f"dp_rank {int(dp[i])} records {int(count[i])} ops, not the {want} (or not the same ones) of the others"

"""A process group's ranks as arithmetic runs, the form they take in a hang snapshot.

Every rank's snapshot names the ranks of each of its groups. Written out, the world group
alone makes a snapshot O(N) bytes and the N snapshots the metrics rank reads O(N^2): 70 GB
at 100k ranks. The groups training builds are arithmetic progressions (tensor parallel:
consecutive ranks; data and pipeline parallel: one stride), so as runs [first, count,
stride] a group is a few numbers whatever its size.
"""

from __future__ import annotations

from typing import Any, Iterable


def to_runs(ranks: Iterable[int]) -> list[list[int]]:
    """The sorted distinct `ranks` as runs [first, count, stride] (count >= 1, stride >= 1;
    a lone rank is [r, 1, 1]). Greedy from the lowest rank: a run goes on while the next rank
    keeps its stride. O(ranks)."""
    rs = sorted(set(int(r) for r in ranks))
    out: list[list[int]] = []
    i = 0
    while i < len(rs):
        if i + 1 == len(rs):
            out.append([rs[i], 1, 1])
            break
        stride, j = rs[i + 1] - rs[i], i + 1
        while j + 1 < len(rs) and rs[j + 1] - rs[j] == stride:
            j += 1
        out.append([rs[i], j - i + 1, stride])
        i = j + 1
    return out


def from_runs(runs: Any) -> tuple[int, ...]:
    """The ranks of `runs` (to_runs' output, as JSON gives it back), ascending. Raises
    ValueError naming the run when one is not three integers with count and stride >= 1."""
    out: list[int] = []
    for run in runs:
        if (not isinstance(run, list) or len(run) != 3 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                                  for x in run) or run[1] < 1 or run[2] < 1):
            raise ValueError(f"rank run {run!r}: expected [first, count >= 1, stride >= 1] of integers")
        first, count, stride = run
        out.extend(range(first, first + count * stride, stride))
    return tuple(out)

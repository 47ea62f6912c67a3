"""The parallel layout of a trace whose records carry their own dp_rank and stage.

The record is the authority on which worker (dp_rank, stage) a rank belongs to; the rank
formula of relax_straggler.common.topology (Megatron's default order) is used when it agrees with
every record, because it also names the ranks the trace did not record. When it does not
(another rank order, context / sequence-data parallel ranks numbered differently), the
layout is the table the records give. A declared layout (--dp/--pp/--tp/--dsp, meta file) bounds
the ids; a record outside it is a contradiction the reader reports with its row.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from relax_straggler.common.topology import MAX_WORLD_SIZE, Layout, Topology
from relax_straggler.readers.base import DENSE_CELLS_FLOOR, DENSE_CELLS_PER_RECORD, InputError, check_dense


def out_of_bounds(topology: Topology, dp: np.ndarray, pp: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(rows,) bool: dp_rank, stage or rank outside the declared layout."""
    return (dp >= topology.dp) | (pp >= topology.pp) | (rank >= topology.world_size)


def resolve_layout(path: str, ranks: np.ndarray, dps: np.ndarray, pps: np.ndarray, rows: np.ndarray,
                   declared: Optional[Topology], steps: int, records: int) -> Topology:
    """The Topology of recorded ranks. ranks, dps, pps, rows: (n,) each recorded rank (every
    id below MAX_WORLD_SIZE), its (dp_rank, stage) as recorded and the 1-based row it first
    appears on (for errors); declared: the layout given by the user or a meta file, or None
    (then dp and pp are the largest ids plus one, and tp is the smallest under which the
    rank formula fits, if any); steps, records: the input's distinct steps and rows, which
    bound the dense work the layout may cost (readers/base.py check_dense).

    Raises InputError naming the file and row when a worker records more ranks than its
    tp x cp slots, or when the largest ids would make the analysis far bigger than the input."""
    if not ranks.size:
        raise InputError(f"{path}: no usable operation rows")
    order = np.argsort(ranks, kind="stable")
    ranks, dps, pps, rows = ranks[order], dps[order], pps[order], rows[order]
    first_row = _FirstRow(ranks, rows)
    if declared is not None:
        candidates = [declared]
    else:
        _check_inferred(path, ranks, dps, pps, first_row, steps, records)
        dp, pp = int(dps.max()) + 1, int(pps.max()) + 1
        tp = -(-(int(ranks.max()) + 1) // (dp * pp))  # the smallest tp whose world holds every rank
        candidates = [Topology(dp=dp, pp=pp, tp=tp)] if dp * pp * tp <= MAX_WORLD_SIZE else []
    for topo in candidates:
        got_dp, got_pp, _ = topo.coords(ranks)
        if ranks.max() < topo.world_size and (got_dp == dps).all() and (got_pp == pps).all():
            return _checked(path, topo, steps, records, declared)
    return _checked(path, _table_layout(path, ranks, dps, pps, first_row, declared), steps, records, declared)


class _FirstRow:
    """rank -> the 1-based row it first appears on, over ranks ascending."""

    def __init__(self, ranks: np.ndarray, rows: np.ndarray) -> None:
        self._ranks, self._rows = ranks, rows

    def __getitem__(self, rank: int) -> int:
        return int(self._rows[np.searchsorted(self._ranks, rank)])


def _cells(topo: Topology) -> int:
    """Rank rows a step costs the analysis: the world, or the workers' slots when more."""
    return max(topo.world_size, topo.dp * topo.pp * topo.slots)


def _checked(path: str, topo: Topology, steps: int, records: int, declared: Optional[Topology]) -> Topology:
    check_dense(path, steps, _cells(topo), records,
                "the declared layout" if declared is not None else "the layout of the recorded ids")
    return topo


def _check_inferred(path: str, ranks: np.ndarray, dps: np.ndarray, pps: np.ndarray, first_row: _FirstRow,
                    steps: int, records: int) -> None:
    """Refuses, naming its row, the largest id when the layout it implies (ranks up to it,
    or dp x pp workers) would cost more dense work than the input allows."""
    by_rank, by_workers = int(ranks.max()) + 1, (int(dps.max()) + 1) * (int(pps.max()) + 1)
    if steps * max(by_rank, by_workers) <= DENSE_CELLS_FLOOR + DENSE_CELLS_PER_RECORD * records:
        return
    if by_rank >= by_workers:
        field, ids = "rank", ranks
    else:
        field, ids = ("dp_rank", dps) if dps.max() >= pps.max() else ("stage", pps)
    value = int(ids.max())
    row = min(first_row[int(r)] for r in ranks[ids == value].tolist())
    raise InputError(f"{path}:{row}: {field} {value} would make the layout {max(by_rank, by_workers):,} ranks wide "
                     f"for {ranks.size:,} recorded ranks over {steps:,} steps ({records:,} rows): a corrupt id?")


def _table_layout(path: str, ranks: np.ndarray, dps: np.ndarray, pps: np.ndarray, first_row: _FirstRow,
                  declared: Optional[Topology]) -> Topology:
    """Slots numbered per worker in rank order; the table spans the declared world, or the
    largest recorded rank."""
    order = np.lexsort((ranks, pps, dps))
    ranks, dps, pps = ranks[order], dps[order], pps[order]
    new_worker = np.r_[True, (dps[1:] != dps[:-1]) | (pps[1:] != pps[:-1])]
    starts = np.flatnonzero(new_worker)
    slot = np.arange(ranks.size) - np.repeat(starts, np.diff(np.r_[starts, ranks.size]))
    if declared is not None and slot.max() >= declared.slots:
        i = int(np.flatnonzero(slot >= declared.slots)[0])
        raise InputError(f"{path}:{first_row[int(ranks[i])]}: rank {int(ranks[i])} is one rank too many for worker "
                         f"dp {int(dps[i])} / stage {int(pps[i])}: the layout gives a worker {declared.slots} "
                         "(tp x dsp) ranks")
    world = declared.world_size if declared is not None else int(ranks.max()) + 1
    if declared is None and (int(dps.max()) + 1) * (int(pps.max()) + 1) * (int(slot.max()) + 1) > MAX_WORLD_SIZE:
        i = int(np.argmax(slot))
        raise InputError(f"{path}:{first_row[int(ranks[i])]}: rank {int(ranks[i])} is rank {int(slot[i]) + 1} of "
                         f"worker dp {int(dps[i])} / stage {int(pps[i])}: {int(dps.max()) + 1} x {int(pps.max()) + 1} workers "
                         f"of that many ranks are beyond the {MAX_WORLD_SIZE:,} ranks a job may have")
    table = np.full((max(world, int(ranks.max()) + 1), 3), -1, dtype=np.int64)
    table[ranks] = np.stack([dps, pps, slot], axis=1)
    if declared is not None:
        return Layout(declared.dp, declared.pp, declared.tp, declared.ranks_per_node, cp=declared.slots // declared.tp,
                      vpp=declared.vpp if isinstance(declared, Layout) else 1, rank_table=table)
    return Layout(int(dps.max()) + 1, int(pps.max()) + 1, int(slot.max()) + 1, rank_table=table)

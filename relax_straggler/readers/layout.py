"""The parallel layout of a trace whose records carry their own dp_rank and stage.

The record is the authority on which worker (dp_rank, stage) a rank belongs to; the rank
formula of relax_straggler.topology (Megatron's default order) is used when it agrees with
every record, because it also names the ranks the trace did not record. When it does not
(another rank order, context / sequence-data parallel ranks numbered differently), the
layout is the table the records give. A declared layout (--dp/--pp/--tp, meta file) bounds
the ids; a record outside it is a contradiction the reader reports with its row.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from relax_straggler.readers.base import InputError
from relax_straggler.topology import MAX_WORLD_SIZE, Layout, Topology


def out_of_bounds(topology: Topology, dp: np.ndarray, pp: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """(rows,) bool: dp_rank, stage or rank outside the declared layout."""
    return (dp >= topology.dp) | (pp >= topology.pp) | (rank >= topology.world_size)


def resolve_layout(path: str, workers: dict[int, tuple[int, int]], first_row: dict[int, int],
                   declared: Optional[Topology]) -> Topology:
    """The Topology of recorded ranks. workers: rank -> (dp_rank, stage) as recorded;
    first_row: rank -> the 1-based row it first appears on (for errors); declared: the
    layout given by the user or a meta file, or None (then dp and pp are the largest ids
    plus one, and tp is the smallest under which the rank formula fits, if any).

    Raises InputError naming the file and row when a worker records more ranks than its
    tp x cp slots."""
    if not workers:
        raise InputError(f"{path}: no usable operation rows")
    ranks = np.fromiter(workers, dtype=np.int64, count=len(workers))
    if int(ranks.max()) >= MAX_WORLD_SIZE:
        rank = int(ranks.max())
        raise InputError(f"{path}:{first_row[rank]}: rank {rank} is beyond the {MAX_WORLD_SIZE:,} ranks a job may "
                         "have (a corrupt value?)")
    coords = np.array(list(workers.values()), dtype=np.int64).reshape(-1, 2)
    dps, pps = coords[:, 0], coords[:, 1]
    if declared is not None:
        candidates = [declared]
    else:
        dp, pp = int(dps.max()) + 1, int(pps.max()) + 1
        candidates = [Topology(dp=dp, pp=pp, tp=tp) for tp in range(1, -(-(int(ranks.max()) + 1) // (dp * pp)) + 1)]
    for topo in candidates:
        got_dp, got_pp, _ = topo.coords(ranks)
        if ranks.max() < topo.world_size and (got_dp == dps).all() and (got_pp == pps).all():
            return topo
    return _table_layout(path, ranks, dps, pps, first_row, declared)


def _table_layout(path: str, ranks: np.ndarray, dps: np.ndarray, pps: np.ndarray, first_row: dict[int, int],
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
    table = np.full((max(world, int(ranks.max()) + 1), 3), -1, dtype=np.int64)
    table[ranks] = np.stack([dps, pps, slot], axis=1)
    if declared is not None:
        return Layout(declared.dp, declared.pp, declared.tp, declared.ranks_per_node, cp=declared.slots // declared.tp,
                      vpp=declared.vpp if isinstance(declared, Layout) else 1, rank_table=table)
    return Layout(int(dps.max()) + 1, int(pps.max()) + 1, int(slot.max()) + 1, rank_table=table)

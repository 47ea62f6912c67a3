"""The parallel layout of a job (dp x pp x tp, and with Layout x dsp) and the rank <->
coordinate maps.

Owned here, below the readers, the analysis and the monitor, which all need it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np


# The largest world an input may describe: the engine sizes its arrays by the world, so one
# corrupt rank id must be refused, not allocated for (monitor, readers, analysis).
MAX_WORLD_SIZE = 1 << 20


def check_world_size(ranks: int) -> None:
    """Raises ValueError when a layout of `ranks` ranks is beyond MAX_WORLD_SIZE."""
    if ranks > MAX_WORLD_SIZE:
        raise ValueError(f"a layout of {ranks:,} ranks is beyond the {MAX_WORLD_SIZE:,} ranks a job may have")


@dataclass(frozen=True)
class Topology:
    """Parallel layout: world_size = dp x pp x tp, ranks ordered tp fastest, then dp, then pp
    (Megatron's default order 'tp-cp-ep-dp-pp' with cp = ep = 1): rank = tp + tp_size x
    (dp + dp_size x pp). A worker is (dp_rank, pp_rank); its ranks are its `slots`.
    ranks_per_node, when known, maps ranks to nodes (rank // it)."""

    dp: int
    pp: int
    tp: int = 1
    ranks_per_node: Optional[int] = None

    def __post_init__(self) -> None:
        for name in ("dp", "pp", "tp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {self.ranks_per_node}")
        check_world_size(self.dp * self.pp * self.slots)

    @property
    def slots(self) -> int:
        """Ranks per worker."""
        return self.tp

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.slots

    @staticmethod
    def flat(world_size: int) -> "Topology":
        """Every rank a peer of every other: data parallel only."""
        return Topology(dp=world_size, pp=1, tp=1)

    def coords(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dp_rank, pp_rank, slot) arrays for global rank ids (slot = tp_rank here)."""
        ranks = np.asarray(ranks, dtype=np.int64)
        return (ranks // self.slots) % self.dp, ranks // (self.slots * self.dp), ranks % self.slots

    def rank_of(self, dp_rank: np.ndarray, pp_rank: np.ndarray, tp_rank: np.ndarray | int = 0) -> np.ndarray:
        """The global rank of (dp_rank, pp_rank, slot)."""
        return np.asarray(tp_rank) + self.slots * (np.asarray(dp_rank) + self.dp * np.asarray(pp_rank))

    def worker_ranks(self, dp_rank: int, pp_rank: int) -> list[int]:
        """Every rank of worker (dp_rank, pp_rank), ascending."""
        return [int(self.rank_of(dp_rank, pp_rank, s)) for s in range(self.slots)]

    def node_of(self, rank: int) -> Optional[int]:
        return None if self.ranks_per_node is None else rank // self.ranks_per_node

    def facts(self) -> dict[str, Any]:
        """The layout as JSON-ready facts: dp, pp, tp, dsp, vpp, world_size, ranks_per_node,
        rank_order ("megatron": the formula above; "recorded": each rank placed by its records)."""
        return {"dp": self.dp, "pp": self.pp, "tp": self.tp, "dsp": 1, "vpp": 1, "world_size": self.world_size,
                "ranks_per_node": self.ranks_per_node, "rank_order": "megatron"}


@dataclass(frozen=True)
class Layout(Topology):
    """A Topology with context / sequence-data parallelism (cp: Megatron's
    context_parallel_size, the what-if traces' dsp_size), virtual pipelines (vpp model chunks
    per stage; per-stage analysis sums a rank's chunks) or a recorded rank order.

    world_size = dp x pp x tp x cp; a worker's slots are tp x cp, slot = tp_rank + tp x
    cp_rank, and by the formula rank = slot + tp x cp x (dp_rank + dp x pp_rank) (Megatron's
    'tp-cp-ep-dp-pp'). rank_table, when given, replaces the formula: (world_size, 3) int64
    rows (dp_rank, pp_rank, slot) indexed by rank, -1 for a rank absent from the records
    (a trace whose rows carry their dp_rank and stage, in another rank order)."""

    cp: int = 1
    vpp: int = 1
    rank_table: Optional[np.ndarray] = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("cp", "vpp"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        super().__post_init__()
        if self.rank_table is not None:
            check_world_size(int(self.rank_table.shape[0]))

    @property
    def slots(self) -> int:
        return self.tp * self.cp

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.slots if self.rank_table is None else int(self.rank_table.shape[0])

    def coords(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.rank_table is None:
            return super().coords(ranks)
        rows = self.rank_table[np.asarray(ranks, dtype=np.int64)]
        return rows[..., 0], rows[..., 1], rows[..., 2]

    def rank_of(self, dp_rank: np.ndarray, pp_rank: np.ndarray, tp_rank: np.ndarray | int = 0) -> np.ndarray:
        """As Topology.rank_of; -1 where the rank table has no such rank."""
        if self.rank_table is None:
            return super().rank_of(dp_rank, pp_rank, tp_rank)
        d, p, s = np.broadcast_arrays(np.asarray(dp_rank), np.asarray(pp_rank), np.asarray(tp_rank))
        t = self.rank_table
        out = np.full(d.shape, -1, dtype=np.int64)
        for i, key in enumerate(zip(d.ravel().tolist(), p.ravel().tolist(), s.ravel().tolist())):
            hit = np.flatnonzero((t[:, 0] == key[0]) & (t[:, 1] == key[1]) & (t[:, 2] == key[2]))
            out.flat[i] = hit[0] if hit.size else -1
        return out

    def worker_ranks(self, dp_rank: int, pp_rank: int) -> list[int]:
        """The worker's ranks: all tp x cp by the formula, the recorded ones by a rank table."""
        if self.rank_table is None:
            return super().worker_ranks(dp_rank, pp_rank)
        t = self.rank_table
        return np.flatnonzero((t[:, 0] == dp_rank) & (t[:, 1] == pp_rank)).tolist()

    def facts(self) -> dict[str, Any]:
        return {**super().facts(), "dsp": self.cp, "vpp": self.vpp,
                "rank_order": "megatron" if self.rank_table is None else "recorded"}


def make_layout(dp: int, pp: int, tp: int = 1, cp: int = 1, vpp: int = 1) -> Topology:
    """A plain Topology when cp = vpp = 1, else a Layout. Raises ValueError for a size < 1
    or a world beyond MAX_WORLD_SIZE."""
    return Topology(dp, pp, tp) if cp == 1 and vpp == 1 else Layout(dp, pp, tp, cp=cp, vpp=vpp)

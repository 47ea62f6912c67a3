"""The parallel layout of a job (dp x pp x tp) and the rank <-> coordinate maps.

Owned here, below the readers, the analysis and the monitor, which all need it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Topology:
    """Parallel layout: world_size = dp x pp x tp, ranks ordered tp fastest, then dp, then pp
    (Megatron's default order 'tp-cp-ep-dp-pp' with cp = ep = 1): rank = tp + tp_size x
    (dp + dp_size x pp). ranks_per_node, when known, maps ranks to nodes (rank // it)."""

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

    @property
    def world_size(self) -> int:
        return self.dp * self.pp * self.tp

    @staticmethod
    def flat(world_size: int) -> "Topology":
        """Every rank a peer of every other: data parallel only."""
        return Topology(dp=world_size, pp=1, tp=1)

    def coords(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(dp_rank, pp_rank, tp_rank) arrays for global rank ids."""
        ranks = np.asarray(ranks, dtype=np.int64)
        return (ranks // self.tp) % self.dp, ranks // (self.tp * self.dp), ranks % self.tp

    def rank_of(self, dp_rank: np.ndarray, pp_rank: np.ndarray, tp_rank: np.ndarray | int = 0) -> np.ndarray:
        return np.asarray(tp_rank) + self.tp * (np.asarray(dp_rank) + self.dp * np.asarray(pp_rank))

    def node_of(self, rank: int) -> Optional[int]:
        return None if self.ranks_per_node is None else rank // self.ranks_per_node

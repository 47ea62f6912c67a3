"""The six-clusterer window detector (relax_straggler.window.detector.window) over recorded steps:
the one adapter `analyze` (its optional second opinion, AnalyzeConfig.ensemble_steps) and
the monitor (the slow iterations it analyses) share.

Ranks are compared within their pipeline stage (rank_to_group = pp rank), so a
structurally slow stage shows as `imbalance`, not as slow ranks. The votes are evidence
beside the attribution; they never create or remove an anomaly of `analyze`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

import numpy as np

from relax_straggler.common.stages import STAGES
from relax_straggler.common.topology import Topology

if TYPE_CHECKING:
    from relax_straggler.window.detector import StageImbalance, WindowConfig


@dataclass(frozen=True)
class EnsembleAnomaly:
    """A rank the clusterers voted slow. rank: global rank id; votes: algorithms (of
    `EnsembleVotes.algorithms`) that put it in their slow cluster; stages: where, slowest
    first; node: its node id when the layout maps ranks to nodes."""

    rank: int
    votes: int
    stages: tuple[str, ...]
    node: Optional[int] = None


@dataclass(frozen=True)
class EnsembleVotes:
    """The detector's answer over `steps` recorded steps (steps_used after its warm-up), in
    global rank ids; `error` names why it rejected the steps (then every other field is
    empty)."""

    steps: int
    steps_used: int = 0
    algorithms: int = 0
    anomalies: tuple[EnsembleAnomaly, ...] = ()
    votes: dict[int, int] = field(default_factory=dict)  # rank -> votes, ranks with at least one
    link_suspects: tuple[int, ...] = ()
    imbalance: tuple[StageImbalance, ...] = ()  # groups are pipeline stages (pp ranks)
    error: Optional[str] = None

    def top(self) -> Optional[EnsembleAnomaly]:
        """The anomaly with the most votes (the first on ties), or None."""
        return max(self.anomalies, key=lambda a: a.votes) if self.anomalies else None

    def to_dict(self) -> dict:
        """The JSON form (`analyze --format json` "ensemble", the monitor's "ensemble")."""
        if self.error is not None:
            return {"steps": self.steps, "error": self.error}
        return {
            "steps": self.steps,
            "steps_used": self.steps_used,
            "anomalies": [{"rank": a.rank, "votes": a.votes, "stages": list(a.stages), "node": a.node}
                          for a in self.anomalies],
            "votes": {str(r): v for r, v in self.votes.items()},
            "algorithms": self.algorithms,
            "link_suspects": list(self.link_suspects),
            "imbalance": [{"stage": i.stage, "slowest_pp_rank": i.slowest_group,
                           "fastest_pp_rank": i.fastest_group, "ratio": i.ratio} for i in self.imbalance],
        }


class StepHistory:
    """The last `max_steps` (all when None) per-rank step matrices, (world, len(STAGES)) ms
    each, NaN for a rank absent from a step."""

    def __init__(self, world_size: int, max_steps: Optional[int] = None) -> None:
        self.world_size = world_size
        self._steps: deque[np.ndarray] = deque(maxlen=max_steps)

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, ranks: np.ndarray, ms: np.ndarray) -> None:
        """ranks: (rows,) global rank ids < world_size; ms: (rows, len(STAGES))."""
        full = np.full((self.world_size, len(STAGES)), np.nan)
        full[ranks] = ms
        self._steps.append(full)

    def stacked(self) -> np.ndarray:
        """(steps, world, len(STAGES)) ms."""
        return np.stack(self._steps)


def run_ensemble(history: StepHistory, topology: Topology, config: Optional["WindowConfig"] = None,
                 ranks: Optional[np.ndarray] = None) -> Optional[EnsembleVotes]:
    """The window detector over `history` (None when it is empty). ranks: the global ranks
    to compare (default: every rank with a time). config: a relax_straggler.window.detector.
    WindowConfig (default: the detector's defaults). Rejections (too few steps after the
    warm-up, too few ranks, a compiled half that does not match relax_straggler/window/detector.py:
    rebuild with `make build`) come back as EnsembleVotes.error, never raised."""
    if not len(history):
        return None
    from relax_straggler.window import detector as detect

    ms = history.stacked()
    if ranks is None:
        ranks = np.flatnonzero(np.isfinite(ms).any(axis=(0, 2)))
    ms = ms[:, ranks, :]
    columns = [j for j in range(len(STAGES)) if np.isfinite(ms[:, :, j]).any()]
    _, pp, _ = topology.coords(ranks)
    nodes = None
    if topology.ranks_per_node is not None:
        nodes = [int(topology.node_of(int(r))) for r in ranks]
    try:
        found = detect.window(ms[:, :, columns], [STAGES[j] for j in columns],
                              config,
                              rank_to_node=nodes, rank_to_group=pp.tolist())
    except (ValueError, TypeError) as exc:
        return EnsembleVotes(steps=len(history), error=f"{type(exc).__name__}: {exc}")
    return EnsembleVotes(
        steps=len(history),
        steps_used=found.steps_used,
        algorithms=len(found.algorithm_slow_ranks),
        anomalies=tuple(EnsembleAnomaly(int(ranks[a.rank]), int(a.votes), tuple(a.stages),
                                        a.node if a.node >= 0 else None) for a in found.anomalies),
        votes={int(ranks[i]): int(v) for i, v in enumerate(found.votes) if v},
        link_suspects=tuple(int(ranks[i]) for i in found.link_suspects),
        imbalance=found.imbalance,
    )

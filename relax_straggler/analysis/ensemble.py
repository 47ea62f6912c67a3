"""Optional second opinion: the six-clusterer window detector (relax_straggler.detect,
issue 5) run on the last N per-rank steps of the input (AnalyzeConfig.ensemble_steps).

Its votes are added to the output beside the attribution; they never create or remove an
anomaly. Ranks are compared within their pipeline stage (rank_to_group = pp rank), so a
structurally slow stage shows as `imbalance`, not as slow ranks.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

import numpy as np

from relax_straggler.readers import StepTimes, Topology
from relax_straggler.stages import STAGES


class EnsembleWindow:
    """Keeps the last `steps` per-rank matrices, (world, len(STAGES)) ms each."""

    def __init__(self, steps: int, topology: Topology) -> None:
        self.topology = topology
        self._window: deque[np.ndarray] = deque(maxlen=steps)

    def add(self, step: StepTimes, ms: np.ndarray) -> None:
        full = np.full((self.topology.world_size, len(STAGES)), np.nan)
        full[step.ranks] = ms
        self._window.append(full)

    def run(self, seen: np.ndarray) -> Optional[dict]:
        """The detector's findings in global rank ids, or {"steps", "error": message} when it
        rejects the window (too few steps after its warm-up, for example) or its compiled
        half does not match relax_straggler/detect.py (TypeError: rebuild with `make build`)."""
        if not self._window:
            return None
        from relax_straggler import detect

        ranks = np.flatnonzero(seen)
        ms = np.stack(self._window)[:, ranks, :]
        columns = [j for j in range(len(STAGES)) if np.isfinite(ms[:, :, j]).any()]
        stages = [STAGES[j] for j in columns]
        _, pp, _ = self.topology.coords(ranks)
        nodes = None
        if self.topology.ranks_per_node is not None:
            nodes = [int(self.topology.node_of(int(r))) for r in ranks]
        try:
            result = detect.window(ms[:, :, columns], stages, rank_to_node=nodes, rank_to_group=pp.tolist())
        except (ValueError, TypeError) as exc:
            return {"steps": len(self._window), "error": f"{type(exc).__name__}: {exc}"}
        return {
            "steps": len(self._window),
            "steps_used": result.steps_used,
            "anomalies": [{"rank": int(ranks[a.rank]), "votes": a.votes, "stages": list(a.stages),
                           "node": a.node if a.node >= 0 else None} for a in result.anomalies],
            "votes": {str(int(ranks[i])): int(v) for i, v in enumerate(result.votes) if v},
            "algorithms": len(result.algorithm_slow_ranks),
            "link_suspects": [int(ranks[i]) for i in result.link_suspects],
            "imbalance": [{"stage": i.stage, "slowest_pp_rank": i.slowest_group, "fastest_pp_rank": i.fastest_group,
                           "ratio": i.ratio} for i in result.imbalance],
        }

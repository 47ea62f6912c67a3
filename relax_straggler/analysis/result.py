"""The offline analysis as typed values: what `build_analysis` (findings.py) concludes from
a RunResult, read by the monitor, the terminal report and the JSON summary (summary.py).

Times are ms per step; ratios are dimensionless (time / reference). Measured facts
(ratios, excesses, counts, steps) and the inferred cause (`Anomaly.cause`, from its kind)
are separate fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import numpy as np

from relax_straggler.analysis.confirmed import ConfirmedSummary
from relax_straggler.window.ensemble import EnsembleVotes


@dataclass(frozen=True)
class InputFacts:
    """What was read. problems: readers.Problems.facts (total, by_kind, first, records,
    records_skipped, steps_listed, steps_lost); topology: {"dp", "pp", "tp",
    "dsp", "vpp", "world_size", "ranks_per_node", "declared", "rank_order" (megatron: the
    default rank formula; recorded: each rank placed by its records)} or None (min/max-only
    input); excluded_ops,
    unknown_ops: op name -> records (trace inputs)."""

    path: str
    format: str
    records: int
    steps: int
    min_max_steps: int
    ranks: int
    topology: Optional[dict[str, Any]]
    median_step_ms: Optional[float]
    per_token: bool
    problems: dict[str, Any]
    excluded_ops: dict[str, int]
    unknown_ops: dict[str, int]


@dataclass(frozen=True)
class Verdict:
    """status: stragglers | imbalance | clean | inconclusive; reason (inconclusive input only):
    rejected_input | too_few_steps; summary: one readable sentence."""

    status: str
    summary: str
    reason: Optional[str] = None


@dataclass(frozen=True)
class StageDetail:
    """One stage (or p2p op) of an anomaly: mean / max ratio and mean excess over the steps
    it was flagged in."""

    stage: str
    mean_ratio: float
    max_ratio: float
    mean_excess_ms: float
    steps_flagged: int
    first_step: int
    last_step: int


@dataclass(frozen=True)
class Anomaly:
    """One finding per worker (dp_rank, pp_rank), pipeline stage (structural: dp_rank None) or
    link (pp_rank None). ranks: every rank of it by the topology; recorded_ranks: those in
    the input; stages: compute stages or p2p ops; mean_ratio / excess_ms: the largest, over
    its stages, of the mean over the flagged steps of its time over the reference / of its
    excess (not a confirmed finding's ratio: docs/METRICS.md, "Ratios and excesses"); cause:
    the kind's explanation in words (inferred; analysis.findings.KIND_EXPLANATIONS); evidence: readable lines."""

    kind: str
    cause: str
    dp_rank: Optional[int]
    pp_rank: Optional[int]
    ranks: tuple[int, ...]
    recorded_ranks: tuple[int, ...]
    nodes: tuple[int, ...]
    stages: tuple[str, ...]
    steps_flagged: int
    steps_total: int
    mean_ratio: float
    excess_ms: float
    details: tuple[StageDetail, ...]
    evidence: tuple[str, ...]


@dataclass(frozen=True)
class Jump:
    step: int
    worker: str
    op: str
    ms: float
    previous_ms: float


@dataclass(frozen=True)
class BaselineOutlier:
    worker: str
    ranks: tuple[int, ...]
    op: str
    mean_ms: float
    baseline_ms: float
    steps_abnormal: int
    steps_explained: int


@dataclass(frozen=True)
class PipelineEvidence:
    """jumps: how many; first_jumps: the first 20; slow_steps: the PP = 2 fallback's."""

    jumps: int = 0
    first_jumps: tuple[Jump, ...] = ()
    baseline_outliers: tuple[BaselineOutlier, ...] = ()
    slow_steps: tuple[int, ...] = ()


@dataclass(frozen=True)
class LateArrivalCount:
    """A worker that arrived last at a collective stage in `steps` steps."""

    worker: str
    ranks: tuple[int, ...]
    stage: str
    steps: int


@dataclass(frozen=True)
class RankScore:
    """score = 1 / compute_slowdown (0..1, lower is slower); compute_slowdown: the rank's
    compute ms over its replicas' median (with two, the other one), time-weighted over the
    compute stages; slowdown and mean_ms per stage (finite values only)."""

    rank: int
    dp_rank: int
    pp_rank: int
    tp_rank: int
    node: Optional[int]
    score: float
    compute_slowdown: float
    slowdown: dict[str, float]
    mean_ms: dict[str, float]


@dataclass(frozen=True)
class RankScores:
    """The RankScore of every recorded rank, kept as columns: O(ranks x stages) numbers and
    no object per rank until one is asked for (a job's logs may hold a million ranks).

    rank, dp_rank, pp_rank, tp_rank: (ranks,) int64, rank ascending; node: (ranks,) int64,
    -1 where nodes are not named; score, compute_slowdown: (ranks,); slowdown: (ranks,
    len(compute_stages)) and mean_ms: (ranks, len(stages)), NaN where not measured.
    Indexing and iteration give RankScores."""

    rank: np.ndarray
    dp_rank: np.ndarray
    pp_rank: np.ndarray
    tp_rank: np.ndarray
    node: np.ndarray
    score: np.ndarray
    compute_slowdown: np.ndarray
    slowdown: np.ndarray
    mean_ms: np.ndarray
    compute_stages: tuple[str, ...]
    stages: tuple[str, ...]

    @staticmethod
    def empty(compute_stages: tuple[str, ...], stages: tuple[str, ...]) -> "RankScores":
        ints, floats = np.zeros(0, np.int64), np.zeros(0)
        return RankScores(ints, ints, ints, ints, ints, floats, floats, np.zeros((0, len(compute_stages))),
                          np.zeros((0, len(stages))), compute_stages, stages)

    def __len__(self) -> int:
        return int(self.rank.size)

    def __getitem__(self, i: int) -> RankScore:
        node = int(self.node[i])
        return RankScore(int(self.rank[i]), int(self.dp_rank[i]), int(self.pp_rank[i]), int(self.tp_rank[i]),
                         None if node < 0 else node, float(self.score[i]), float(self.compute_slowdown[i]),
                         _finite(self.compute_stages, self.slowdown[i]), _finite(self.stages, self.mean_ms[i]))

    def __iter__(self) -> Iterator[RankScore]:
        return (self[i] for i in range(len(self)))

    def slowest(self, n: int) -> "RankScores":
        """The n entries of lowest score (the lower rank first on a tie), rank ascending."""
        keep = np.sort(np.argsort(self.score, kind="stable")[:n])
        return RankScores(self.rank[keep], self.dp_rank[keep], self.pp_rank[keep], self.tp_rank[keep],
                          self.node[keep], self.score[keep], self.compute_slowdown[keep], self.slowdown[keep],
                          self.mean_ms[keep], self.compute_stages, self.stages)

    def find(self, rank: int) -> Optional[RankScore]:
        """The entry of `rank`, or None when the input did not record it."""
        i = int(np.searchsorted(self.rank, rank))
        return self[i] if i < self.rank.size and self.rank[i] == rank else None


def _finite(names: tuple[str, ...], values: np.ndarray) -> dict[str, float]:
    return {n: x for n, x in zip(names, values.tolist()) if math.isfinite(x)}


@dataclass(frozen=True)
class Analysis:
    """The whole answer. anomalies: persistent findings, most steps first; transient: the
    others; min_max: {"steps", "stages"} of min/max-only logs or None; limitations: what this
    input cannot conclude."""

    input: InputFacts
    verdict: Verdict
    anomalies: tuple[Anomaly, ...]
    transient: tuple[Anomaly, ...]
    pipeline: PipelineEvidence
    late_arrivals: tuple[LateArrivalCount, ...]
    per_rank: RankScores
    ensemble: Optional[EnsembleVotes]
    confirmed: Optional[ConfirmedSummary]  # the live analyzer's confirmed verdict over the steps
    min_max: Optional[dict[str, Any]]
    limitations: tuple[str, ...]

    def rank_score(self, rank: int) -> Optional[RankScore]:
        """The per-rank entry of `rank`, or None when the input did not record it."""
        return self.per_rank.find(rank)

"""Windowed robust straggler detection: six clusterers per stage and votes across them.

The engine is csrc/core/detect (docs/DETECTION.md describes the algorithms); this module
gives it plain Python data. Shapes and units:

  ms       float64 (steps, ranks, stages), milliseconds; NaN, 0, +-inf or < 0 = the rank
           did not run the stage that step (the engine's one rule, docs/ARCHITECTURE.md data
           contract; Report.judged_ms of consecutive reports, stacked).
  stages   one name per column (relax_straggler.common.stages names; ``communication`` and
           ``communication/<op>`` are judged by the late-arrival rule, docs/ARCHITECTURE.md invariant 7).

Example::

    from relax_straggler.window import detector as detect
    result = detect.window(ms, stages)
    result.anomaly_ranks        # (7,)
    result.votes[7]             # 6: all six algorithms call rank 7 slow
    result.anomalies[0].stages  # ('forward', 'backward', 'communication')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from relax_straggler._ext import core
from relax_straggler.common import thresholds
from relax_straggler.common.metric_names import WINDOW_PREFIX

ALGORITHMS: tuple[str, ...] = ("kmeans", "dbscan", "gmm", "agglomerative", "mean_shift", "fuzzy_cmeans")

# The engine names nested options by their C++ path; these are their fields here.
_ENGINE_NAMES = {"dbscan.min_samples": "dbscan_min_samples", "dbscan.eps_scales": "dbscan_eps_scales",
                 "mean_shift.quantiles": "mean_shift_quantiles", "fuzzy_cmeans.fuzzifiers": "fuzzifiers"}


@dataclass(frozen=True)
class WindowConfig:
    """Settings of the window detector; defaults follow mt-detector's (max-vote, at least 3 of 6).

    Raises ValueError naming the field when the engine rejects a value.
    """

    warmup_steps: int = 10  # leading steps of the window ignored
    min_relative_spread: float = 0.03  # drop a stage with (max - min) / mean of per-rank means below this
    min_coverage: float = 0.5  # every rank must have run a kept stage in this fraction of the steps
    trim_fraction: float = 0.1  # per rank and stage, this fraction of the largest times is set aside (hiccups)
    max_slow_fraction: float = 0.5  # a slow cluster is a minority of the ranks
    min_slowdown: float = thresholds.WINDOW_MIN_SLOWDOWN  # and at least this much slower (relative) than the body
    link_min_z: float = 5.0  # a slow link must also stand this many robust sigmas above the body
    stage_vote_fraction: float = 0.5  # an algorithm calls a rank slow in >= this fraction of its stages
    min_algorithm_votes: int = thresholds.WINDOW_MIN_VOTES  # algorithms that must agree before a report
    vote_rule: str = "most_votes"  # "most_votes" (mt-detector's max-vote) or "at_least" (>= min_algorithm_votes)
    algorithms: tuple[str, ...] = ALGORITHMS
    stage_weights: Mapping[str, float] = field(default_factory=dict)  # stage -> weight >= 0, absent = 1
    max_points: int = 512  # ranks beyond this are clustered through a weighted coreset
    seed: int = 0
    dbscan_min_samples: float = 8.0
    dbscan_eps_scales: tuple[float, ...] = (0.5, 0.75, 1.0, 1.5, 2.0)  # multiples of the k-distance knee
    mean_shift_quantiles: tuple[float, ...] = (0.1, 0.2, 0.3)  # bandwidth grid
    fuzzifiers: tuple[float, ...] = (1.5, 2.0, 2.5)  # Fuzzy C-Means m grid
    kmeans_restarts: int = 3
    threads: int = 1  # stages clustered in parallel; keep 1 on a training node

    def native(self) -> Any:
        """The engine's config object. Raises ValueError on an invalid field."""
        kwargs = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        kwargs["algorithms"] = list(self.algorithms)
        kwargs["stage_weights"] = {str(k): float(v) for k, v in self.stage_weights.items()}
        for name in ("dbscan_eps_scales", "mean_shift_quantiles", "fuzzifiers"):
            kwargs[name] = [float(v) for v in kwargs[name]]
        try:
            return core().detect.WindowConfig(**kwargs)
        except ValueError as exc:
            message = str(exc)
            for engine, ours in _ENGINE_NAMES.items():
                message = message.replace(engine, ours)
            raise ValueError(message) from None

    def replace(self, **changes: Any) -> "WindowConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class StageResult:
    """One stage (column) of the window."""

    stage: str
    communication: bool
    status: str  # "kept", "not_run", "coverage_gap" or "low_spread"
    relative_spread: float  # (max - min) / mean of per-rank means; NaN unless the stage passed coverage
    slow_ranks: dict[str, tuple[int, ...]]  # algorithm -> ranks slower than the body (empty unless kept)
    late_ranks: dict[str, tuple[int, ...]]  # algorithm -> late arrivals (communication stages)
    chosen: dict[str, str]  # algorithm -> hyper-parameter its grid search chose


@dataclass(frozen=True)
class RankFinding:
    rank: int
    votes: int  # algorithms calling the rank slow
    node: int  # from rank_to_node; -1 when no map was given
    stages: tuple[str, ...]  # stages where at least half of the algorithms flagged it


@dataclass(frozen=True)
class StageImbalance:
    """Structural imbalance between rank groups (pipeline stages) in one stage, live and
    offline alike (relax_straggler.window.ensemble, whose groups are the pp ranks)."""

    stage: str
    slowest_group: int
    fastest_group: int
    ratio: float  # slowest / fastest group median of the per-rank mean
    group_mean_ms: tuple[float, ...]  # per group id, ms; NaN for an empty group


@dataclass(frozen=True)
class WindowResult:
    """What the window detector found. Rank ids are positions in the ms array."""

    steps_used: int  # steps after warm-up
    num_ranks: int
    anomalies: tuple[RankFinding, ...]
    votes: np.ndarray  # int32 (ranks,): algorithms calling each rank slow, 0..len(algorithms)
    algorithm_slow_ranks: dict[str, tuple[int, ...]]  # per algorithm, after its stage vote
    algorithm_ms: dict[str, float]  # per algorithm, wall time of its clustering, ms
    algorithm_cpu_ms: dict[str, float]  # per algorithm, CPU time of the same, ms (load-independent)
    stages: tuple[StageResult, ...]
    anomaly_nodes: tuple[int, ...]
    link_suspects: tuple[int, ...]  # longer communication than peers, not slow otherwise
    imbalance: tuple[StageImbalance, ...]  # worst first, when rank_to_group was given
    absent_ranks: tuple[int, ...]  # no time in any stage of the window
    elapsed_ms: float

    @property
    def anomaly_ranks(self) -> tuple[int, ...]:
        return tuple(a.rank for a in self.anomalies)

    def metrics(self, prefix: str = WINDOW_PREFIX) -> dict[str, Any]:
        """Flat metrics: anomaly_ranks, num_anomalies, votes/<rank> (ranks with votes),
        stages/<rank> (anomalies, comma-separated), link_suspects, anomaly_nodes (with a
        node map), imbalance/<stage> (ratio, with a group map), steps, elapsed_ms."""
        m: dict[str, Any] = {
            prefix + "anomaly_ranks": list(self.anomaly_ranks),
            prefix + "num_anomalies": len(self.anomalies),
            prefix + "link_suspects": list(self.link_suspects),
            prefix + "steps": self.steps_used,
            prefix + "elapsed_ms": self.elapsed_ms,
        }
        for rank in np.flatnonzero(self.votes):
            m[f"{prefix}votes/{int(rank)}"] = int(self.votes[rank])
        for a in self.anomalies:
            m[f"{prefix}stages/{a.rank}"] = ",".join(a.stages)
        if any(a.node >= 0 for a in self.anomalies):
            m[prefix + "anomaly_nodes"] = list(self.anomaly_nodes)
        for imb in self.imbalance:
            m[f"{prefix}imbalance/{imb.stage}"] = imb.ratio
        return m


def _rank_map(values: Optional[Sequence[int]], num_ranks: int, name: str) -> list[int]:
    if values is None:
        return []
    out = [int(v) for v in values]
    if len(out) != num_ranks:
        raise ValueError(f"{name} has {len(out)} entries, expected one per rank ({num_ranks})")
    if any(v < 0 for v in out):
        raise ValueError(f"{name} ids must be >= 0")
    return out


def window(ms: np.ndarray, stages: Sequence[str], config: Optional[WindowConfig] = None, *,
           rank_to_node: Optional[Sequence[int]] = None,
           rank_to_group: Optional[Sequence[int]] = None) -> WindowResult:
    """Runs the window detector over `ms` (steps, ranks, stages) in ms.

    rank_to_node: node id per rank; anomalies then name their node.
    rank_to_group: group id per rank for ranks that do different work by design (the
    pipeline stage of each rank); ranks are then compared within their group and
    structural differences between groups are reported as `imbalance`.
    Raises ValueError on a shape mismatch, a bad map or an invalid config field.
    """
    arr = np.ascontiguousarray(ms, dtype=np.float64)
    if arr.ndim != 3:
        raise ValueError(f"ms must be a 3-D (steps, ranks, stages) array, got shape {arr.shape}")
    names = [str(s) for s in stages]
    if arr.shape[2] != len(names):
        raise ValueError(f"ms has {arr.shape[2]} stage columns but {len(names)} stage names were given")
    cfg = config or WindowConfig()
    native = cfg.native()
    nodes = _rank_map(rank_to_node, arr.shape[1], "rank_to_node")
    groups = _rank_map(rank_to_group, arr.shape[1], "rank_to_group")
    r = core().detect.detect_window(arr, names, native, nodes, groups)
    return _result(r, cfg)


def _result(r: Any, cfg: WindowConfig) -> WindowResult:
    algs = tuple(a.algorithm for a in r.algorithms)
    stages = []
    for s in r.stages:
        per = list(s.algorithms)
        stages.append(StageResult(
            stage=s.stage,
            communication=s.communication,
            status=s.status,
            relative_spread=s.relative_spread,
            slow_ranks={a: tuple(p.slow_ranks) for a, p in zip(algs, per)},
            late_ranks={a: tuple(p.late_ranks) for a, p in zip(algs, per)},
            chosen={a: p.chosen for a, p in zip(algs, per)},
        ))
    return WindowResult(
        steps_used=r.steps_used,
        num_ranks=r.num_ranks,
        anomalies=tuple(RankFinding(a.rank, a.votes, a.node, tuple(a.stages)) for a in r.anomalies),
        votes=np.asarray(r.votes, dtype=np.int32),
        algorithm_slow_ranks={a.algorithm: tuple(a.slow_ranks) for a in r.algorithms},
        algorithm_ms={a.algorithm: a.elapsed_ms for a in r.algorithms},
        algorithm_cpu_ms={a.algorithm: a.cpu_ms for a in r.algorithms},
        stages=tuple(stages),
        anomaly_nodes=tuple(r.anomaly_nodes),
        link_suspects=tuple(r.link_suspects),
        imbalance=tuple(StageImbalance(i.stage, i.slowest_group, i.fastest_group, i.ratio, tuple(i.group_mean_ms))
                        for i in r.imbalance),
        absent_ranks=tuple(r.absent_ranks),
        elapsed_ms=r.elapsed_ms,
    )


def cluster(points: np.ndarray, algorithm: str, *, weights: Optional[np.ndarray] = None,
            config: Optional[WindowConfig] = None) -> tuple[np.ndarray, str]:
    """One clusterer as the ensemble runs it on a stage: its grid search, two groups.

    points: float64 (n, d); weights: (n,) > 0 or None (all 1). Returns (labels (n,) int32,
    -1 = DBSCAN noise; the hyper-parameter chosen, e.g. "linkage=single").
    Raises ValueError on an unknown algorithm or malformed input.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; algorithms are: {', '.join(ALGORITHMS)}")
    pts = np.ascontiguousarray(points, dtype=np.float64)
    w = None if weights is None else np.ascontiguousarray(weights, dtype=np.float64)
    labels, chosen = core().detect.cluster(pts, w, algorithm, (config or WindowConfig()).native())
    return np.asarray(labels, dtype=np.int32), chosen

"""One triggered analysis of the monitor: the rows of a job's slow window, through the
offline engine (pipeline attribution, relax_straggler.analysis.engine.analyze) and the
six-clusterer window detector (relax_straggler.detect.window, with no warm-up: the window
is exactly the slow iterations), into the JSON the API serves.

The straggler named is the first anomaly of the attribution (most steps flagged, then the
largest excess; within a tensor-parallel worker, its rank with the largest compute
slowdown); when the attribution finds none, the window detector's anomaly with the most
votes. Its node is the node name its rows carry.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Iterator, Optional

import numpy as np

from relax_straggler.analysis import AnalyzeConfig, analyze, build_summary
from relax_straggler.monitor.store_base import Store
from relax_straggler.monitor.trigger import Window
from relax_straggler.readers.base import InputError, StepTimes, Topology
from relax_straggler.readers.metrics_rows import StoreSource

# Evidence lines kept per result.
MAX_EVIDENCE = 12
# Largest rank id + 1 an analysis accepts (and largest registered layout, api.py): the engine
# sizes its arrays by the world, so one stray rank id in the rows must not size them.
MAX_RANKS = 1 << 20


class _Recording:
    """Passes a StoreSource's steps to analyze() and keeps them for the window detector
    (a window is a few iterations: history_size x ranks x stages floats)."""

    def __init__(self, source: StoreSource) -> None:
        self.source = source
        self.kept: list[StepTimes] = []
        for name in ("path", "format", "problems", "total_bytes", "done_bytes", "names", "topology"):
            setattr(self, name, getattr(source, name))

    @property
    def records(self) -> int:
        return self.source.records

    def steps(self) -> Iterator[StepTimes]:
        for step in self.source.steps():
            if len(step.ranks) and int(step.ranks.max()) >= MAX_RANKS:
                raise InputError(f"{self.path}: step {step.step}: rank {int(step.ranks.max())} is beyond the "
                                 f"{MAX_RANKS:,} ranks the monitor analyses")
            self.kept.append(step)
            yield step


def analyse_window(store: Store, job: str, window: Window, since: float, topology: Optional[Topology],
                   config: AnalyzeConfig = AnalyzeConfig()) -> dict:
    """The result of analysing iterations [window.first_iteration, window.last_iteration]
    of `job` with rows not older than `since` (s). Keys: window, verdict, straggler_rank,
    straggler_node, stage, stages, kind, cause, ratio, excess_ms, votes, algorithms,
    ensemble, evidence, problems, rows, analysis_s, finished_at.
    Raises StoreError (store), InputError (no usable row, ranks outside the topology or at
    or beyond MAX_RANKS)."""
    start = time.perf_counter()
    source = StoreSource(store, job, window.first_iteration, window.last_iteration, since=since, topology=topology)
    recording = _Recording(source)
    ranks_per_node = topology.ranks_per_node if topology is not None else None
    result = analyze(recording, replace(config, ensemble_steps=0), ranks_per_node=ranks_per_node)
    summary = build_summary(result)
    ensemble = _ensemble(recording.kept, result.topology)
    rank, anomaly = _straggler(summary, ensemble)
    votes = ensemble.get("votes", {}).get(str(rank), 0) if rank is not None else 0
    evidence = list(anomaly["evidence"]) if anomaly else []
    if rank is not None and "votes" in ensemble:
        evidence.append(f"window detector: rank {rank} voted slow by {votes} of {ensemble['algorithms']} clusterers")
    return {
        "window": {"first_iteration": window.first_iteration, "last_iteration": window.last_iteration,
                   "since": since},
        "verdict": summary["verdict"],
        "straggler_rank": rank,
        "straggler_node": source.nodes.get(rank) if rank is not None else None,
        "kind": anomaly["kind"] if anomaly else ("individual" if rank is not None else None),
        "cause": anomaly["cause"] if anomaly else None,
        "stage": anomaly["stages"][0] if anomaly and anomaly["stages"] else _ensemble_stage(ensemble, rank),
        "stages": anomaly["stages"] if anomaly else [],
        "ratio": anomaly["ratio"] if anomaly else None,
        "excess_ms": anomaly["excess_ms"] if anomaly else None,
        "votes": votes,
        "algorithms": ensemble.get("algorithms"),
        "ensemble": ensemble,
        "evidence": evidence[:MAX_EVIDENCE],
        "problems": summary["input"]["problems"],
        "rows": source.records,
        "analysis_s": time.perf_counter() - start,
        "finished_at": time.time(),
    }


def _straggler(summary: dict, ensemble: dict) -> tuple[Optional[int], Optional[dict]]:
    anomalies = summary["anomalies"]
    if anomalies:
        top = anomalies[0]
        ranks = top["recorded_ranks"] or top["ranks"]
        slowdown = {r["rank"]: r["compute_slowdown"] for r in summary["per_rank"]}
        return max(ranks, key=lambda r: slowdown.get(r, 0.0)), top
    found = ensemble.get("anomalies") or []
    if found:
        return max(found, key=lambda a: a["votes"])["rank"], None
    return None, None


def _ensemble_stage(ensemble: dict, rank: Optional[int]) -> Optional[str]:
    for a in ensemble.get("anomalies") or []:
        if a["rank"] == rank and a["stages"]:
            return a["stages"][0]
    return None


def _ensemble(steps: list[StepTimes], topology: Optional[Topology]) -> dict:
    """The window detector over the window's steps, in global rank ids ({"error": ...}
    when it rejects the window, e.g. too few ranks)."""
    from relax_straggler import detect

    if not steps or topology is None:
        return {}
    world = topology.world_size
    ms = np.full((len(steps), world, steps[0].ms.shape[1]), np.nan)
    for i, step in enumerate(steps):
        ms[i, step.ranks] = step.ms
    ranks = np.flatnonzero(np.isfinite(ms).any(axis=(0, 2)))
    ms = ms[:, ranks, :]
    columns = [j for j in range(ms.shape[2]) if np.isfinite(ms[:, :, j]).any()]
    stages = [StepTimes.stages[j] for j in columns]
    _, pp, _ = topology.coords(ranks)
    try:
        found = detect.window(ms[:, :, columns], stages, detect.WindowConfig(warmup_steps=0),
                              rank_to_group=pp.tolist())
    except (ValueError, TypeError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {
        "steps": len(steps),
        "algorithms": len(found.algorithm_slow_ranks),
        "anomalies": [{"rank": int(ranks[a.rank]), "votes": a.votes, "stages": list(a.stages)}
                      for a in found.anomalies],
        "votes": {str(int(ranks[i])): int(v) for i, v in enumerate(found.votes) if v},
        "link_suspects": [int(ranks[i]) for i in found.link_suspects],
    }

"""One triggered analysis of the monitor: the rows of a job's slow iterations, through the
offline engine (pipeline attribution, relax_straggler.analysis.engine.analyze) and the
six-clusterer window detector (relax_straggler.window.ensemble, with no warm-up: the
range is exactly the slow iterations), into the JSON the API serves.

The straggler named is the first anomaly of the attribution (most steps flagged, then the
largest excess; within a tensor-parallel worker, its rank with the largest compute
slowdown); when the attribution finds none, the window detector's anomaly with the most
votes. Its node is the node name its rows carry. When the job's own store sink wrote its
confirmed verdict (relax_straggler.stores.verdict_rows), the newest in the range is kept
beside, as the job reached it (its comparison groups, workloads and window ensemble).
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Iterator, Optional, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.analysis import Analysis, AnalyzeConfig, analyze, build_analysis
from relax_straggler.analysis.headline import headline
from relax_straggler.analysis.result import Anomaly
from relax_straggler.analysis.summary import verdict_dict
from relax_straggler.common.metric_names import FINDING_METRIC, VERDICT_METRIC
from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology
from relax_straggler.monitor.picture import window_picture
from relax_straggler.monitor.trigger import IterationRange
from relax_straggler.readers.base import InputError, StepTimes
from relax_straggler.readers.metrics_rows import StoreSource
from relax_straggler.stores import verdict_rows
from relax_straggler.stores.base import Sample, Store, table_to_samples
from relax_straggler.window.detector import WindowConfig
from relax_straggler.window.ensemble import EnsembleVotes, StepHistory, run_ensemble

# Evidence lines kept per result.
MAX_EVIDENCE = 12
# Largest rank id + 1 an analysis accepts (and largest registered layout, api.py).
MAX_RANKS = MAX_WORLD_SIZE
_VERDICT_NAMES = pa.array([VERDICT_METRIC, FINDING_METRIC])


class _VerdictTap:
    """A Store whose tables() passes the rows on and keeps the verdict rows among them (as
    Samples: a few per iteration), so one read of the range serves the analysis and the
    live verdict."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.rows: list[Sample] = []

    def tables(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[pa.Table]:
        for table in self.store.tables(job, first_iteration, last_iteration, since):
            verdicts = table.filter(pc.is_in(table.column("metric_name"), value_set=_VERDICT_NAMES))
            self.rows.extend(table_to_samples(verdicts))
            yield table

    def __getattr__(self, name: str):
        return getattr(self.store, name)


def _live_verdict(rows: Sequence[Sample]) -> Optional[dict]:
    """The newest verdict the job wrote in the range, None without one; a malformed verdict
    row is named in the result instead (the analysis stands on the timer rows)."""
    try:
        return verdict_rows.latest_verdict(rows)
    except ValueError as exc:
        return {"error": str(exc)}


class _Recording:
    """Passes a StoreSource's steps to analyze() and keeps them for the window detector
    (a slow range is a few iterations: history_size x ranks x stages floats)."""

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


def analyze_range(store: Store, job: str, window: IterationRange, since: float, topology: Optional[Topology],
                  config: AnalyzeConfig = AnalyzeConfig()) -> dict:
    """The result of analysing iterations [window.first_iteration, window.last_iteration]
    of `job` with rows not older than `since` (s). Keys: window, verdict, straggler_rank,
    straggler_node, stage, stages, kind, cause, mean_ratio, excess_ms, votes, algorithms,
    ensemble, confirmed (the live analyzer's confirmed verdict replayed over the range's
    iterations), live_verdict (the job's own, relax_straggler.stores.verdict_rows.latest_verdict,
    or None), evidence, picture (picture.window_picture), problems, rows, analysis_s, finished_at.
    Raises StoreError (store), InputError (no usable row, ranks outside the topology or at
    or beyond MAX_RANKS)."""
    start = time.perf_counter()
    tap = _VerdictTap(store)
    source = StoreSource(tap, job, window.first_iteration, window.last_iteration, since=since, topology=topology)
    recording = _Recording(source)
    ranks_per_node = topology.ranks_per_node if topology is not None else None
    result = analyze(recording, replace(config, ensemble_steps=0), ranks_per_node=ranks_per_node)
    analysis = build_analysis(result)
    ensemble = _ensemble(recording.kept, result.topology)
    rank, anomaly = _straggler(analysis, ensemble)
    voted = ensemble is not None and ensemble.error is None
    votes = ensemble.votes.get(rank, 0) if voted and rank is not None else 0
    confirmed = asdict(analysis.confirmed) if analysis.confirmed is not None else None
    stage = anomaly.stages[0] if anomaly and anomaly.stages else _ensemble_stage(ensemble, rank)
    evidence = list(anomaly.evidence) if anomaly else []
    if rank is not None and voted:
        evidence.append(f"window detector: rank {rank} voted slow by {votes} of {ensemble.algorithms} clusterers")
    return {
        "window": {"first_iteration": window.first_iteration, "last_iteration": window.last_iteration,
                   "since": since},
        "verdict": headline(verdict_dict(analysis.verdict), confirmed, None, config.min_impact),
        "straggler_rank": rank,
        "straggler_node": source.nodes.get(rank) if rank is not None else None,
        "kind": anomaly.kind if anomaly else ("individual" if rank is not None else None),
        "cause": anomaly.cause if anomaly else None,
        "stage": stage,
        "stages": list(anomaly.stages) if anomaly else [],
        "mean_ratio": anomaly.mean_ratio if anomaly else None,
        "excess_ms": anomaly.excess_ms if anomaly else None,
        "votes": votes,
        "algorithms": ensemble.algorithms if voted else None,
        "ensemble": ensemble.to_dict() if ensemble is not None else {},
        "confirmed": confirmed,
        "live_verdict": _live_verdict(tap.rows),
        "evidence": evidence[:MAX_EVIDENCE],
        "picture": window_picture(recording.kept, stage),
        "problems": analysis.input.problems,
        "rows": source.records,
        "analysis_s": time.perf_counter() - start,
        "finished_at": time.time(),
    }


def _ensemble(steps: list[StepTimes], topology: Optional[Topology]) -> Optional[EnsembleVotes]:
    """The window detector over the range's steps, with no warm-up (None without steps)."""
    if not steps or topology is None:
        return None
    history = StepHistory(topology.world_size)
    for step in steps:
        history.add(step.ranks, step.ms)
    return run_ensemble(history, topology, WindowConfig(warmup_steps=0))


def _straggler(analysis: Analysis, ensemble: Optional[EnsembleVotes]) -> tuple[Optional[int], Optional[Anomaly]]:
    if analysis.anomalies:
        top = analysis.anomalies[0]

        def slowdown(rank: int) -> float:
            score = analysis.rank_score(rank)
            return score.compute_slowdown if score is not None else 0.0

        return max(top.recorded_ranks or top.ranks, key=slowdown), top
    top = ensemble.top() if ensemble is not None else None
    return (top.rank, None) if top is not None else (None, None)


def _ensemble_stage(ensemble: Optional[EnsembleVotes], rank: Optional[int]) -> Optional[str]:
    for a in ensemble.anomalies if ensemble is not None else ():
        if a.rank == rank and a.stages:
            return a.stages[0]
    return None

"""Offline analysis: streams a Source's steps through the C++ RunAttributor and keeps
O(ranks) running statistics, never the steps themselves.

Per per-rank step (StepTimes, ms):
  1. ranks -> workers (dp_rank, pp_rank): the tensor-parallel ranks of a worker run in
     lockstep, so a worker's compute and p2p times are the max over its ranks (the worker
     is as slow as its slowest rank), its collective times the min (docs/ARCHITECTURE.md invariant 7: the rank
     that arrives last waits least);
  2. compute stages (forward, backward, optimizer, data, attention, moe; per token when
     every rank reported its workload) and pipeline p2p times go to the RunAttributor:
     individual vs structural slowness and send/recv cross-validation
     (csrc/core/attribute);
  3. collective late arrivals (docs/ARCHITECTURE.md invariant 7), also in the RunAttributor
     (csrc/core/attribute/late_arrival.h): per pipeline stage, the dp replica with the
     shortest collective time is the one the others waited for;
  4. per-rank running sums: mean ms per stage, and the slowdown against the median of the
     rank's dp replicas of the same pipeline stage, per compute stage and over all compute
     (sum of its compute ms / sum of the references: time-weighted, so a 0.2 ms stage's
     jitter does not dominate).
Min/max-only steps (MinMaxStep) are summarized separately (minmax.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Optional

import numpy as np

from relax_straggler._ext import core
from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.analysis.confirmed import ConfirmedSummary, ConfirmedTally
from relax_straggler.analysis.minmax import MinMaxSummary
from relax_straggler.analysis.rank_timeline import RankTimeline
from relax_straggler.common.stages import STAGE_IDS, STAGES, is_communication
from relax_straggler.common.topology import Topology
from relax_straggler.common.workload import normalize_workload
from relax_straggler.readers import InputError, MinMaxStep, Source, StepTimes
from relax_straggler.window.ensemble import EnsembleVotes, StepHistory, run_ensemble

COMPUTE_STAGES: tuple[str, ...] = tuple(s for s in STAGES if not is_communication(s))
COLLECTIVE_STAGES: tuple[str, ...] = tuple(
    s for s in STAGES if is_communication(s) and s not in ("communication/send", "communication/recv"))
_COMPUTE = np.array([STAGE_IDS[s] for s in COMPUTE_STAGES])
_COLLECTIVE = np.array([STAGE_IDS[s] for s in COLLECTIVE_STAGES])

Progress = Callable[[int, int], None]  # (done_bytes, total_bytes)


class _WorkerMap:
    """Rows of one rank list -> workers w = pp_rank x dp + dp_rank (reduce by a ufunc)."""

    def __init__(self, ranks: np.ndarray, topology: Topology) -> None:
        dp, pp, _ = topology.coords(ranks)
        self.pp_of_row, self.dp_of_row = pp, dp
        worker = pp * topology.dp + dp
        self.workers = topology.dp * topology.pp
        self.order = np.argsort(worker, kind="stable")
        sorted_w = worker[self.order]
        self.starts = np.flatnonzero(np.r_[True, sorted_w[1:] != sorted_w[:-1]])
        self.present = sorted_w[self.starts]
        self.identity = self.present.size == ranks.size and bool((self.order == np.arange(ranks.size)).all())

    def reduce(self, values: np.ndarray, op: np.ufunc) -> np.ndarray:
        out = np.full((self.workers, values.shape[1]), np.nan)
        if self.identity:
            out[self.present] = values
        else:
            out[self.present] = op.reduceat(values[self.order], self.starts, axis=0)
        return out


@dataclass
class RankStats:
    """Running per-rank sums, indexed by global rank (world_size rows)."""

    sum_ms: np.ndarray  # (world, STAGES) ms
    count: np.ndarray  # (world, STAGES) steps with a value
    sum_slowdown: np.ndarray  # (world, COMPUTE_STAGES) t / peer reference
    slowdown_count: np.ndarray
    sum_total: np.ndarray  # (world,) compute time over the peer references' sum (time-weighted slowdown)
    total_count: np.ndarray

    @staticmethod
    def zeros(world: int) -> "RankStats":
        return RankStats(np.zeros((world, len(STAGES))), np.zeros((world, len(STAGES)), np.int64),
                         np.zeros((world, len(COMPUTE_STAGES))), np.zeros((world, len(COMPUTE_STAGES)), np.int64),
                         np.zeros(world), np.zeros(world, np.int64))

    def mean_ms(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.count > 0, self.sum_ms / np.maximum(self.count, 1), np.nan)

    def mean_slowdown(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.slowdown_count > 0, self.sum_slowdown / np.maximum(self.slowdown_count, 1), np.nan)

    def mean_total_slowdown(self) -> np.ndarray:
        """(world,) mean over steps of sum(compute ms) / sum(peer references), NaN if none."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.total_count > 0, self.sum_total / np.maximum(self.total_count, 1), np.nan)


@dataclass
class RunResult:
    """Everything the report needs. run: relax_straggler._core.RunAttribution."""

    source: Source
    topology: Optional[Topology]
    config: AnalyzeConfig
    run: object
    stats: Optional[RankStats]
    late_arrivals: Optional[np.ndarray]  # (workers, COLLECTIVE_STAGES) steps each worker arrived last
    seen_ranks: np.ndarray  # (world,) bool: the rank appeared in the input
    steps: int
    step_ms: np.ndarray  # measured step times, ms (finite ones)
    has_p2p: bool
    per_token: bool
    minmax: MinMaxSummary
    ensemble: Optional[EnsembleVotes]  # the window detector's votes (AnalyzeConfig.ensemble_steps), or None
    confirmed: Optional[ConfirmedSummary]  # the live analyzer's confirmed verdict over the steps, or None
    timeline: Optional[RankTimeline] = None  # per-rank compute slowdown over time (analyze(timeline=True))


class _Run:
    def __init__(self, topology: Topology, config: AnalyzeConfig, timeline: bool = False) -> None:
        self.topology = topology
        self.config = config
        self.attributor = core().RunAttributor(topology.dp, topology.pp, list(COMPUTE_STAGES), config.engine_config(),
                                               list(COLLECTIVE_STAGES))
        self.stats = RankStats.zeros(topology.world_size)
        self.seen = np.zeros(topology.world_size, dtype=bool)
        self.maps: dict[bytes, _WorkerMap] = {}
        self.steps = 0
        self.step_ms: list[float] = []
        self.has_p2p = False
        self.per_token = False
        self.history = StepHistory(topology.world_size, config.ensemble_steps) if config.ensemble_steps else None
        self.confirmed = ConfirmedTally(config)
        self.timeline = RankTimeline(topology) if timeline else None

    def add(self, step: StepTimes, path: str) -> None:
        topo = self.topology
        if step.ranks.size and int(step.ranks.max()) >= topo.world_size:
            raise InputError(f"{path}: step {step.step}: rank {int(step.ranks.max())} is outside the topology "
                             f"(dp {topo.dp} x pp {topo.pp} x tp {topo.tp} = {topo.world_size} ranks)")
        key = step.ranks.tobytes()
        wm = self.maps.get(key)
        if wm is None:
            wm = self.maps.setdefault(key, _WorkerMap(step.ranks, topo))
        ms = step.ms
        if step.tokens is not None and np.all(np.isfinite(step.tokens) & (step.tokens > 0)):
            ms = normalize_workload(ms, STAGES, step.tokens)
            self.per_token = True
        compute = wm.reduce(ms[:, _COMPUTE], np.fmax)
        p2p = None
        if topo.pp >= 2:
            if step.p2p_ms is not None:
                self.has_p2p = True
                p2p = wm.reduce(step.p2p_ms, np.fmax)
            else:
                p2p = np.full((wm.workers, 4), np.nan)
        collective = wm.reduce(ms[:, _COLLECTIVE], np.fmin)
        sa = self.attributor.add_step(step.step, compute, p2p, step.step_ms, collective)
        self.steps += 1
        if np.isfinite(step.step_ms):
            self.step_ms.append(step.step_ms)
        # Each row's reference: its stage's median over the data-parallel replicas, or with two
        # replicas the other one (the median of two would halve a slowdown), as the attribution.
        if topo.dp == 2:
            ref = compute[wm.pp_of_row * 2 + 1 - wm.dp_of_row]
        else:
            ref = self.attributor.peer_refs(sa)[wm.pp_of_row]
        self._fold_rank_stats(step, ms, ref)
        self.confirmed.add(step.step, step.ranks, ms, wm.pp_of_row, step.run_queue_ms)
        if self.history is not None:
            self.history.add(step.ranks, ms)

    def _fold_rank_stats(self, step: StepTimes, ms: np.ndarray, ref: np.ndarray) -> None:
        """Folds one step into the per-rank sums; ref: (rows, compute stages) each row's peer
        reference."""
        s, r = self.stats, step.ranks
        compute = ms[:, _COMPUTE]
        with np.errstate(invalid="ignore", divide="ignore"):
            slowdown = compute / ref
            paired = np.isfinite(compute) & np.isfinite(ref)
            total = np.where(paired, compute, 0.0).sum(axis=1) / np.where(paired, ref, 0.0).sum(axis=1)
        ran, ok, total_ok = ~np.isnan(ms), np.isfinite(slowdown), np.isfinite(total)
        if self.timeline is not None:
            self.timeline.add(step.step, r, total)
        if r.size == self.seen.size:  # every rank (ranks are ascending and unique): fold in place
            self.seen[:] = True
            np.add(s.sum_ms, ms, out=s.sum_ms, where=ran)
            s.count += ran
            np.add(s.sum_slowdown, slowdown, out=s.sum_slowdown, where=ok)
            s.slowdown_count += ok
            np.add(s.sum_total, total, out=s.sum_total, where=total_ok)
            s.total_count += total_ok
            return
        self.seen[r] = True
        s.sum_ms[r] += np.where(ran, ms, 0.0)
        s.count[r] += ran
        s.sum_slowdown[r] += np.where(ok, slowdown, 0.0)
        s.slowdown_count[r] += ok
        s.sum_total[r] += np.where(total_ok, total, 0.0)
        s.total_count[r] += total_ok


def analyze(source: Source, config: AnalyzeConfig = AnalyzeConfig(), ranks_per_node: Optional[int] = None,
            progress: Optional[Progress] = None, timeline: bool = False) -> RunResult:
    """Reads every step of `source` and attributes; with `timeline`, also keeps each rank's
    compute slowdown over time for the heatmap (RunResult.timeline, analysis/rank_timeline.py).
    Raises InputError when the input has no usable step, or when its ranks do not fit its
    topology; ValueError on a bad config."""
    config.engine_config()  # validate before reading
    run: Optional[_Run] = None
    minmax = MinMaxSummary()
    for step in source.steps():
        if isinstance(step, MinMaxStep):
            minmax.add(step)
        else:
            if run is None:
                topo = source.topology() or Topology.flat(int(step.ranks.max()) + 1)
                if ranks_per_node is not None:
                    topo = replace(topo, ranks_per_node=ranks_per_node)
                run = _Run(topo, config, timeline)
            run.add(step, source.path)
        if progress is not None:
            progress(source.done_bytes, source.total_bytes)
    if run is None and minmax.steps == 0:
        raise InputError(f"{source.path}: no step could be read")
    if run is not None and int(run.seen.sum()) < 2:
        raise InputError(f"{source.path}: the input has a single rank: stragglers are found by comparing ranks")
    attribution = None if run is None else run.attributor.finish()
    return RunResult(
        source=source,
        topology=None if run is None else run.topology,
        config=config,
        run=attribution,
        stats=None if run is None else run.stats,
        late_arrivals=None if run is None else attribution.late_arrivals.reshape(-1, len(COLLECTIVE_STAGES)),
        seen_ranks=np.zeros(0, bool) if run is None else run.seen,
        steps=0 if run is None else run.steps,
        step_ms=np.array([] if run is None else run.step_ms),
        has_p2p=run is not None and run.has_p2p,
        per_token=run is not None and run.per_token,
        minmax=minmax,
        confirmed=None if run is None else run.confirmed.summary(),
        timeline=None if run is None else run.timeline,
        ensemble=None if run is None or run.history is None else run_ensemble(run.history, run.topology,
                                                                              ranks=np.flatnonzero(run.seen)),
    )

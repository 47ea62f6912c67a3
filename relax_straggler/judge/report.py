"""From gathered rows to a Report: the judged matrix, the verdict and the per-step metrics.

Runs on the metrics rank's report thread, never on the training thread. The metrics' names:
relax_straggler.common.metric_names (documented in docs/METRICS.md).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from relax_straggler._ext import core
from relax_straggler.config import StragglerConfig
from relax_straggler.common.metric_names import (COMMUNICATION_BLAMED_RANK, COMMUNICATION_COLLECTIVES,
                                          COMMUNICATION_LATE_ARRIVALS, COMMUNICATION_WAIT_MS, DRIFTED_RANKS, HINTS,
                                          LIKELY_BOTTLENECK, MISMATCHED_RANKS, NUM_STRAGGLERS, PREFIX,
                                          UNUSABLE_TIMES, stage_prefix)
from relax_straggler.common.payload import Gathered, GcPauseRows, KernelMatrix
from relax_straggler.common.stacks import StackSample, decode
from relax_straggler.common.stages import STAGES, is_communication
from relax_straggler.common.workload import normalize_workload

if TYPE_CHECKING:
    from relax_straggler.judge.confirm import VerdictResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Report:
    """One judged sampled step. Arrays are (ranks, len(stages)) in ms, NaN = not run. build_report
    gives the per-step rule's (verdict None); relax_straggler.judge.Judge the whole one."""

    step: int
    stages: tuple[str, ...]  # the stages some rank ran, in STAGES order
    device_ms: np.ndarray  # as measured
    judged_ms: np.ndarray  # what was judged: device_ms, per-token normalized where workloads were given
    tokens: Optional[np.ndarray]  # (ranks,) or None
    stragglers: dict[str, tuple[int, ...]]  # stage -> flagged ranks
    likely_bottleneck: Optional[str]
    top_ranks: dict[str, int]  # stage -> top rank
    hints: str
    metrics: dict[str, Any] = field(default_factory=dict)
    comm_wait_ms: Optional[np.ndarray] = None  # (ranks,) time each waited for late arrivals
    groups: Optional[np.ndarray] = None  # (ranks,) comparison group ids when ranks were judged within groups
    verdict: Optional["VerdictResult"] = None  # the confirmed verdict after this report (relax_straggler.judge)
    kernel: Optional[KernelMatrix] = None  # (ranks, len(stages)) with --straggler-kernel-stats, judged like device_ms
    run_queue_ms: Optional[np.ndarray] = None  # (ranks,) training thread's wait for a CPU in the step, NaN = not measured
    gc: Optional[GcPauseRows] = None  # (ranks,) per field: GC pauses over the steps since each rank's previous row
    stacks: dict[int, StackSample] = field(default_factory=dict)  # rank -> its sampled stack, where one travelled

    @property
    def num_ranks(self) -> int:
        return int(self.device_ms.shape[0])


def verdict_config(config: StragglerConfig):
    C = core()
    ref = C.Reference.MEAN if config.ref == "mean" else C.Reference.MEDIAN
    return C.VerdictConfig(config.relative_threshold, config.absolute_ms_threshold, config.noise_floor_ms, ref)


@dataclass(frozen=True)
class LateArrivals:
    """Late-arrival evidence over the collectives comparable across ranks (docs/ARCHITECTURE.md invariant 7):
    in each, the rank with the shortest duration arrived last and every other rank
    waited (its duration - the shortest)."""

    blamed_rank: int
    late_counts: np.ndarray  # (ranks,) collectives in which each rank arrived last
    wait_ms: np.ndarray  # (ranks,) summed waiting, ms
    collectives: int


def late_arrivals(gathered: Gathered, judged: np.ndarray) -> Optional[LateArrivals]:
    """None unless every judged rank (a row not all NaN in `judged`) reported the same
    number (> 0) of comparable collectives: only then are they the same collectives."""
    ok = ~np.all(np.isnan(judged), axis=1)
    counts = gathered.comparable_count[ok]
    if counts.size < 2 or counts.min() != counts.max() or counts[0] == 0:
        return None
    n = int(counts[0])
    durations = gathered.comparable_ms[ok, :n]
    if not np.isfinite(durations).all():
        return None
    blamed, late, waited = core().collective_waits(durations)
    ranks = np.flatnonzero(ok)
    late_counts = np.zeros(gathered.num_ranks, dtype=np.int64)
    wait_ms = np.full(gathered.num_ranks, np.nan)
    late_counts[ranks] = late
    wait_ms[ranks] = waited
    return LateArrivals(int(ranks[blamed]), late_counts, wait_ms, n)


_warned: set[str] = set()  # setup problems already logged (each once per process)


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message + " (logged once)", *args)


def comparison_groups(groups: np.ndarray, step: int) -> Optional[np.ndarray]:
    """The ranks' comparison group ids when every rank gave one and there are at least two
    groups; else None (all ranks are compared with each other). Some ranks without a
    group is a setup error: it is logged and the step is judged ungrouped."""
    if np.all(groups < 0):
        return None
    if np.any(groups < 0):
        _warn_once("partial", "relax_straggler: step %d: ranks %s gave no comparison group while others did; "
                   "comparing all ranks", step, np.flatnonzero(groups < 0).tolist())
        return None
    distinct = np.unique(groups).size
    if distinct == groups.size:
        # Pipeline parallelism alone (DP = TP = 1): no rank has a peer doing the same work.
        _warn_once("singletons", "relax_straggler: every comparison group has one rank: no rank can be named a "
                   "straggler, only the imbalance between groups is reported")
    return groups if distinct > 1 else None


MIN_COMPUTE_MS = 1e-3  # the compute time of a section that was all wait, ms


def drifted_ranks(forward_passes: np.ndarray, metrics_rank: int) -> np.ndarray:
    """(ranks,) bool: ranks whose training forward passes so far differ from their peers'
    (the most common count; on a tie, the metrics rank's). A rank that skipped an optimizer
    step (a GradScaler overflow only it saw) runs one step more per step label from then on:
    its rows describe other iterations than its peers', although the gathers pair them.
    NaN counts (not counted: no model hooks) drift nowhere."""
    counted = np.isfinite(forward_passes)
    if counted.sum() < 2:
        return np.zeros(forward_passes.shape, dtype=bool)
    values, counts = np.unique(forward_passes[counted], return_counts=True)
    common = values[counts == counts.max()]
    own = forward_passes[metrics_rank] if metrics_rank < forward_passes.size else np.nan
    reference = own if own in common else common[0]
    return counted & (forward_passes != reference)


def build_report(gathered: Gathered, step: int, config: StragglerConfig, metrics_rank: int,
                 counters: dict[str, int], label: Optional[int] = None) -> Report:
    """Judges one step's gathered rows (step: the analyzer's count, which every row must
    carry). counters: loss counters to publish with it. label: the step's number in the
    report and its messages (install(step_label=...)); default step."""
    shown = step if label is None else label
    # Compute stages are judged on compute time: the part of a section spent blocked
    # on a collective is taken out (docs/ARCHITECTURE.md invariant 8).
    compute = np.array([not is_communication(s) for s in STAGES])
    device_ms = gathered.device_ms - np.where(compute, np.nan_to_num(gathered.waited_ms), 0.0)
    # A section that was all wait (a fast rank blocked inside it on a slow peer) ran: its
    # compute is ~0, not "not run", which the engine reads 0 and below as (step_matrix.h).
    ran_all_wait = (gathered.device_ms > 0) & ~(device_ms > 0)
    device_ms[ran_all_wait] = MIN_COMPUTE_MS
    mismatched = gathered.steps != step
    drifted = drifted_ranks(gathered.forward_passes, metrics_rank)
    if drifted.any():
        _warn_once("drift", "relax_straggler: step %d: ranks %s have run %s training forward passes where their "
                   "peers ran %d: an optimizer step was skipped there (e.g. a GradScaler overflow only they saw), "
                   "so their steps no longer line up with their peers'; they are not judged from now on "
                   "(straggler/drifted_ranks)", shown, np.flatnonzero(drifted).tolist(),
                   sorted({int(n) for n in gathered.forward_passes[drifted]}),
                   int(gathered.forward_passes[~drifted & np.isfinite(gathered.forward_passes)][0]))
    if mismatched.any() or drifted.any():
        # A rank whose step counter differs, or whose steps drifted, is not comparable with
        # the others: its row is not judged, and counted.
        device_ms[mismatched | drifted, :] = np.nan
    ran = ~np.all(np.isnan(device_ms), axis=0)
    stages = tuple(s for s, keep in zip(STAGES, ran) if keep)
    device_ms = device_ms[:, ran]
    # The kernel fields of the rows judged, in the same columns (NaN where not measured).
    kernel = (gathered.kernel.select(~(mismatched | drifted), ran)
              if config.kernel_stats and gathered.kernel is not None else None)

    tokens = gathered.tokens
    judged = device_ms
    tokens_given = bool(np.all(np.isfinite(tokens) & (tokens > 0)))
    if tokens_given:
        judged = normalize_workload(device_ms, stages, tokens)
        if kernel is not None:  # compared as the stage times are: per token
            kernel = KernelMatrix(*(normalize_workload(a, stages, tokens)
                                    for a in (kernel.kernel_ms, kernel.idle_ms, kernel.nccl_ms)))
    elif np.any(np.isfinite(tokens)):
        log.warning("relax_straggler: step %d: only some ranks set a workload; comparing raw times", shown)

    groups = comparison_groups(gathered.groups, shown)
    verdict = core().judge_step(judged, list(stages), shown, verdict_config(config),
                                None if groups is None else groups.tolist())
    stragglers = {sv.stage: tuple(sv.stragglers) for sv in verdict.stages}
    top_ranks = {sv.stage: sv.top_rank for sv in verdict.stages}
    bottleneck = verdict.stages[verdict.likely_bottleneck].stage if verdict.likely_bottleneck >= 0 else None

    metrics: dict[str, Any] = {}
    for j, sv in enumerate(verdict.stages):
        p = stage_prefix(sv.stage)
        local = judged[metrics_rank, j] if metrics_rank < judged.shape[0] else math.nan
        metrics[p + "local_ms"] = float(local)
        metrics[p + "mean_ms"] = sv.mean_ms
        metrics[p + "ref_ms"] = sv.ref_ms
        metrics[p + "max_ms"] = sv.max_ms
        metrics[p + "slowdown_ratio"] = sv.slowdown_ratio
        metrics[p + "relative_score"] = sv.relative_score
        metrics[p + "top_rank"] = sv.top_rank
        metrics[p + "num_stragglers"] = len(sv.stragglers)
        if groups is not None:
            metrics[p + "imbalance_ratio"] = sv.imbalance_ratio
        if kernel is not None:
            top = sv.top_rank if 0 <= sv.top_rank < judged.shape[0] else None
            for name, values in (("kernel_ms", kernel.kernel_ms), ("idle_ms", kernel.idle_ms),
                                 ("nccl_ms", kernel.nccl_ms)):
                metrics[p + name] = math.nan if top is None else float(values[top, j])
    metrics[LIKELY_BOTTLENECK] = bottleneck or "none"
    metrics[HINTS] = verdict.hints
    metrics[NUM_STRAGGLERS] = verdict.num_stragglers
    metrics[MISMATCHED_RANKS] = int(mismatched.sum())
    metrics[DRIFTED_RANKS] = int(drifted.sum())
    metrics[UNUSABLE_TIMES] = verdict.unusable_cells
    if verdict.unusable_cells:
        _warn_once("unusable", "relax_straggler: step %d: %d measured times were infinite or negative and are judged "
                   "as not run (straggler/unusable_times counts them per report)", shown, verdict.unusable_cells)
    late = late_arrivals(gathered, device_ms)
    if late is not None:
        metrics[COMMUNICATION_BLAMED_RANK] = late.blamed_rank
        metrics[COMMUNICATION_WAIT_MS] = float(np.nanmean(late.wait_ms))
        metrics[COMMUNICATION_LATE_ARRIVALS] = int(late.late_counts[late.blamed_rank])
        metrics[COMMUNICATION_COLLECTIVES] = late.collectives
    for name, value in counters.items():
        metrics[PREFIX + name] = value

    return Report(
        step=shown,
        stages=stages,
        device_ms=device_ms,
        judged_ms=judged,
        tokens=tokens.copy() if tokens_given else None,
        stragglers=stragglers,
        likely_bottleneck=bottleneck,
        top_ranks=top_ranks,
        hints=verdict.hints,
        metrics=metrics,
        comm_wait_ms=None if late is None else late.wait_ms,
        groups=groups,
        kernel=kernel,
        run_queue_ms=np.where(mismatched | drifted, np.nan, gathered.run_queue_ms),
        gc=None if gathered.gc is None else gathered.gc.masked(mismatched | drifted),
        stacks=_stacks(gathered, mismatched | drifted),
    )


def _stacks(gathered: Gathered, skipped: np.ndarray) -> dict[int, StackSample]:
    """The sampled stacks that travelled in the rows (rank -> sample), but for rows not judged;
    a malformed one is logged once and left out."""
    out: dict[int, StackSample] = {}
    if gathered.stack is None:
        return out
    for rank in np.flatnonzero(np.isfinite(gathered.stack[:, 0]) & ~skipped):
        try:
            sample = decode(gathered.stack[rank])
        except ValueError as exc:
            _warn_once("stack", "relax_straggler: rank %d's stack sample is malformed (%s); left out", int(rank), exc)
            continue
        if sample is not None:
            out[int(rank)] = sample
    return out

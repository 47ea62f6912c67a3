"""The confirmed straggler verdict: one decision across sampled reports.

The per-step rule (report.py: slow in a stage if t >= ref x relative_threshold or
t - ref >= absolute_ms_threshold, relax_straggler.common.thresholds) judges each sampled step
alone; this module keeps evidence across reports and answers with states a person can act
on. The arithmetic is the engine's (csrc/core/confirm); this module gives it plain Python
data and, when configured, runs the window ensemble (relax_straggler.window.live) every
``window_every`` reports as a second witness. The live analyzer, ``analyze``, the monitor
and the detection-quality benchmark all call it::

    from relax_straggler.judge.confirm import ConfirmConfig, ConfirmedVerdict
    verdict = ConfirmedVerdict(ConfirmConfig(window_every=10))
    for report in reports:                       # on the report thread, in step order
        result = verdict.update(report.step, report.judged_ms, report.stages, groups=report.groups)
        result.status                            # "straggler"
        result.primary.describe()                # "rank 1 straggler in forward since step 110: ..."
        metrics.update(result.metrics())         # straggler/verdict/*

Shapes and units: ms float64 (ranks, stages), milliseconds, NaN = not run; stages one
name per column (``communication`` and ``communication/<op>`` follow the late-arrival
rule, invariant 7); groups one comparison group id >= 0 per rank (the pipeline stage) or
None; workload tokens per rank (> 0) or None (then compute stages that scale with work
are compared per token).

States: ``healthy``, ``suspected`` (slow in the latest report(s)), ``straggler``
(confirmed: ``confirm_reports`` reports in a row beyond the minimum effect size and the
learned noise, or by evidence accumulated over reports (a sequential test on the rank's
place in its group, for shifts smaller than one report's noise), or named by the window
ensemble with a mean ratio that agrees),
``recovered``, ``imbalance`` (a whole group slower: structural), ``insufficient_evidence``
(nothing judgeable yet, or every rank alone in its group). Facts (measured) and cause
(inferred: ``compute``, ``communication_link``, ``data``, ``imbalance``, ``unknown``,
``untimed_code`` (slow in the measured ``untimed`` stage: the rank's own code outside every
timed section), and from kernel records ``device`` or ``host``) are separate fields. Given kernel records
(``update(..., kernel=)``, --straggler-kernel-stats), a ``compute`` cause is refined by the
engine's rule (csrc/core/confirm/kernel_cause.h): ``device`` (its kernels ran longer than
its group's), ``host`` (its stream sat idle longer) or ``communication_link`` (its NCCL
kernels ran longer while its peers' compute was normal); it stays ``compute`` where the
records do not tell (not measured, or no field dominates), and the measured kernel times go
to ``facts.kernel``. Given each rank's run-queue wait (``update(..., run_queue_ms=)``: how
long its training thread waited for a CPU in the step, relax_straggler.live.run_queue), a
``compute``, ``data``, ``communication_link`` or ``unknown`` cause becomes ``host_contention``
first when the rank's wait beyond its group's explains at least half of the finding's excess
(HOST_CONTENTION_SHARE; both the medians over the finding's recent reports, so one descheduled
step or one report's noise does not decide it): its core was shared, the work did not grow; the
waits go to ``facts.run_queue_ms`` / ``run_queue_excess_ms``. Given each rank's
garbage-collection pauses (``update(..., gc=)``: pause time and collections over every step
since its previous row, relax_straggler.live.gc_pauses), the same causes, and
``host_contention`` where the pauses explain more than the wait, become ``gc`` when the rank's
pause time per step beyond its group's explains at least half of the finding's excess
(GC_SHARE). Pauses are rare and long, so they are pooled over the steps of the reports agreeing
with the finding (a mean per step, not a median of reports, which would miss them) and compared
with its typical excess; a pause that landed on the sampled step itself is compared with that
step's excess: either explains it. The pooled pauses go to ``facts.gc_*``. A ``recovered``
finding keeps the cause it had in the last report that confirmed it: the cause is that of the
slowdown it recovered from, not a reading of the healthy reports since. So does a ``straggler``
in a report that does not show its excess (still listed until the release, or held by
accumulated evidence): a wait or a pause there explains no slowdown. A listed finding's cause
changes like a state: once another cause has been read in ``confirm_reports`` reports in a row
that show its excess (one full collection on a sampled step is a fact of the finding, not a new
cause). Not thread-safe: call update from one thread.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from relax_straggler._ext import core
from relax_straggler.common import thresholds
from relax_straggler.config import StragglerConfig
from relax_straggler.window.detector import WindowConfig, WindowResult
from relax_straggler.common.metric_names import (VERDICT_CAUSE, VERDICT_CONFIDENCE, VERDICT_RANK, VERDICT_RATIO,
                                          VERDICT_SINCE_STEP, VERDICT_STAGE, VERDICT_STATUS)
from relax_straggler.common.payload import GC_FIELDS, GcPauseRows, KernelMatrix
from relax_straggler.common.stacks import StackSample
from relax_straggler.common.stages import WORKLOAD_STAGES
from relax_straggler.common.validators import require_int, require_window_size
from relax_straggler.common.workload import normalize_workload
from relax_straggler.window.live import WindowDetector

STATES = ("healthy", "suspected", "straggler", "recovered", "imbalance", "insufficient_evidence")
# The package's one cause vocabulary: a confirmed finding's inferred cause, live, offline
# (analyze's `confirmed`) and in the store's verdict rows.
CAUSES = ("compute", "communication_link", "data", "imbalance", "unknown", "device", "host", "host_contention", "gc",
          "untimed_code")
# The causes run-queue evidence can overturn: what a slow rank's time looked like, not a
# measurement of its device (kernel records) or a whole group (imbalance).
_CONTENDABLE = frozenset(("compute", "communication_link", "data", "unknown", "untimed_code"))
# The share of a finding's excess the rank's extra run-queue wait must explain to name host
# contention: the larger part of the time it lost was spent waiting for a CPU.
HOST_CONTENTION_SHARE = 0.5
# The share of a finding's excess the rank's extra garbage-collection pause time per step must
# explain to name gc: the larger part of the time it lost, the interpreter spent collecting.
GC_SHARE = 0.5

# The engine's fields, in ConfirmConfig order.
_ENGINE_FIELDS = ("relative_threshold", "absolute_ms_threshold", "min_impact", "noise_sigmas", "confirm_reports", "recover_reports",
                  "min_reports", "history", "noise_memory", "window_sigmas", "reference_sample",
                  "min_noise", "sequential_budget")


def _default_window_config() -> WindowConfig:
    # At least 3 of the 6 clusterers (not only the most-voted ranks): every rank the
    # ensemble is sure of, since the tracker still asks the rank's mean ratio to agree.
    return WindowConfig(vote_rule="at_least", min_algorithm_votes=thresholds.WINDOW_MIN_VOTES)


@dataclass(frozen=True)
class ConfirmConfig:
    """Settings of the confirmed verdict (csrc/core/confirm/config.h explains each).

    relative_threshold / absolute_ms_threshold: the slow-rank rule (t >= ref x relative or
    t - ref >= absolute ms, relax_straggler.common.thresholds) as the minimum effect size of one
    report (dimensionless, ms). noise_sigmas: learned-noise sigmas a ratio must also clear.
    confirm_reports / recover_reports: reports in a row to confirm / recover.
    sequential_budget: false alarms per report the sequential test may raise in a
    healthy job, by design (0 = off; csrc/core/confirm/sequential.h).
    window_every: run the window ensemble every this many reports (0 = off);
    window_size: reports it looks at; window_skip: leading reports it ignores (warm-up);
    window_config: its settings. Raises ValueError naming the field.
    """

    relative_threshold: float = thresholds.RELATIVE_THRESHOLD
    absolute_ms_threshold: float = thresholds.ABSOLUTE_MS_THRESHOLD
    min_impact: float = 0.02
    noise_sigmas: float = 4.0
    confirm_reports: int = 3
    recover_reports: int = 2
    min_reports: int = 2
    history: int = 8
    noise_memory: int = 16
    window_sigmas: float = 4.0
    reference_sample: int = 32
    min_noise: float = 0.002
    sequential_budget: float = 1e-3
    window_every: int = 0
    window_size: int = 50
    window_skip: int = 0
    window_config: WindowConfig = field(default_factory=_default_window_config)

    def __post_init__(self) -> None:
        for name in ("window_every", "window_skip"):
            require_int(getattr(self, name), name, 0)
        require_window_size(self.window_size, "window_size")
        self.native()  # the engine validates the rest, naming the field

    def native(self) -> Any:
        """The engine's config object. Raises ValueError on an invalid field."""
        return core().confirm.ConfirmConfig(**{name: getattr(self, name) for name in _ENGINE_FIELDS},
                                            workload_stages=sorted(WORKLOAD_STAGES))

    def replace(self, **changes: Any) -> "ConfirmConfig":
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_config(config: StragglerConfig) -> "ConfirmConfig":
        """The confirmed verdict a StragglerConfig asks for (the live analyzer's, and the
        benchmark's with StragglerConfig()): its slow-rank thresholds as the minimum effect size,
        its confirm / recover counts and window ensemble settings."""
        return ConfirmConfig(
            relative_threshold=config.relative_threshold, absolute_ms_threshold=config.absolute_ms_threshold,
            confirm_reports=config.confirm_reports, recover_reports=config.recover_reports,
            window_every=config.window_every, window_size=config.window_size,
            window_config=WindowConfig(vote_rule=config.window_vote_rule, min_algorithm_votes=config.window_min_votes,
                                       min_slowdown=config.window_min_slowdown))


@dataclass(frozen=True)
class KernelFacts:
    """What the kernel records measured in the finding's stage, latest report, ms (per token
    with a workload); NaN = not measured. The reference is, per field, the median over the
    other ranks of the group that measured it."""

    kernel_ms: float  # compute (non-NCCL) kernels running
    idle_ms: float  # nothing running on the section's stream
    nccl_ms: float  # NCCL kernels running
    ref_kernel_ms: float
    ref_idle_ms: float
    ref_nccl_ms: float
    peers: int  # other ranks of the group with every field measured


@dataclass(frozen=True)
class Facts:
    """Measured or counted, never inferred. Times in ms (per token with a workload)."""

    rank_ms: float  # the rank's time in the stage, latest report
    ref_ms: float  # its group's reference (median of the other ranks)
    excess_ms: float  # distance from the reference on the slow side
    median_ratio: float  # median rank / reference over every recent tracked report (at most 8), agreeing or not
    noise: float  # learned relative noise sigma of the (group, stage)
    wait_caused_ms: float  # peers' wait at collectives traced to this finding, latest report
    waiting_ranks: tuple[int, ...]  # ranks whose wait (late arrival, p2p) traces back here
    reports_agreeing: int
    reports_seen: int
    window_votes: int  # the window ensemble's votes, 0 when it did not name the rank
    kernel: Optional[KernelFacts] = None  # kernel records of the stage, when given to update()
    # The rank's training thread waiting for a CPU in the step (whole step, not the stage),
    # when given to update(): latest report, and beyond its group's median of the others,
    # median over the finding's recent reports (reports_seen). NaN = not measured.
    run_queue_ms: float = float("nan")
    run_queue_excess_ms: float = float("nan")
    # The process's garbage-collection pauses, when given to update(), pooled over every step
    # of the reports agreeing with the finding (gc_steps of them): pause time and collections,
    # those of full collections, and the pause time per step beyond its group's median of the
    # others; the pause time within the latest sampled step and beyond its group's. NaN = not
    # measured.
    gc_ms: float = float("nan")
    gc_count: float = float("nan")
    gc_full_ms: float = float("nan")
    gc_full_count: float = float("nan")
    gc_steps: float = float("nan")
    gc_excess_ms: float = float("nan")
    gc_step_ms: float = float("nan")
    gc_step_excess_ms: float = float("nan")
    # Where its training thread was: its most frequent frames over a few sampled steps after
    # it was confirmed (relax_straggler.live.stack_sampler), when given to update(); None until then.
    stack: Optional[StackSample] = None


@dataclass(frozen=True)
class Finding:
    """One (rank, stage) not healthy, or one imbalanced stage (rank -1, group: the listed,
    slowest one)."""

    rank: int
    group: int
    stage: str
    state: str  # one of STATES
    since_step: int
    confidence: float  # 0..1, share of recent reports whose evidence agrees with the state
    # Median over its agreeing recent reports of rank / reference (late arrival: reference / rank;
    # imbalance: the listed group's work / the fastest group's, in the latest report): the one
    # ratio of a finding (docs/METRICS.md).
    ratio: float
    persistent: bool  # confirmed by consecutive reports
    by_window: bool  # confirmed by the window ensemble
    facts: Facts
    cause: str  # inferred, one of CAUSES
    by_sequential: bool = False  # confirmed by evidence accumulated over reports (sequential test)

    def describe(self) -> str:
        """One line, facts first and the inferred cause last."""
        agree = f"{self.facts.reports_agreeing} of {self.facts.reports_seen} reports"
        if self.rank < 0:
            return (f"group {self.group} {self.state} in {self.stage} since step {self.since_step}: "
                    f"{self.ratio:.2f}x the fastest group, {agree}; cause: {self.cause}")
        line = (f"rank {self.rank} {self.state} in {self.stage} since step {self.since_step}: "
                f"{self.ratio:.2f}x its group, {agree}")
        if self.facts.waiting_ranks:
            waiting = self.facts.waiting_ranks
            line += f"; rank{'s' if len(waiting) > 1 else ''} {', '.join(map(str, waiting))} waited on it"
        if self.facts.run_queue_excess_ms > 0:
            line += f"; its thread waited {self.facts.run_queue_excess_ms:.1f} ms more for a CPU than its group's"
        if self.cause == "gc":  # the pauses of every other finding are in its facts only
            line += (f"; it paused {self.facts.gc_ms:.1f} ms in {self.facts.gc_count:.0f} garbage collections "
                     f"({self.facts.gc_full_count:.0f} full) over its last {self.facts.gc_steps:.0f} steps, "
                     f"{self.facts.gc_excess_ms:.1f} ms a step more than its group's")
            if self.facts.gc_step_excess_ms > 0:
                line += f", {self.facts.gc_step_excess_ms:.1f} ms more in this step"
        if self.facts.stack is not None and self.facts.stack.frames:
            line += f"; its training thread was in {self.facts.stack.describe()}"
        return f"{line}; cause: {self.cause}"


@dataclass(frozen=True)
class VerdictResult:
    """The confirmed verdict after one report."""

    step: int
    status: str  # one of STATES: the most severe over the findings but suspected (a finding, not the job's state)
    findings: tuple[Finding, ...]  # stragglers first, then imbalance, suspected, recovered
    unjudged_ranks: tuple[int, ...]  # alone in their comparison group
    reports: int  # reports seen since the last reset
    reset: bool  # this report started a new run (ranks, stages or groups changed)
    window: Optional[WindowResult] = None  # the window ensemble's result when it ran on this report

    @property
    def primary(self) -> Optional[Finding]:
        """The headline finding, or None when all is healthy."""
        return self.findings[0] if self.findings else None

    @property
    def straggler_ranks(self) -> tuple[int, ...]:
        return tuple(sorted({f.rank for f in self.findings if f.state == "straggler" and f.rank >= 0}))

    def metrics(self) -> dict[str, Any]:
        """straggler/verdict/* of this report. The headline has a subject or is empty: a rank
        in state straggler, or a group in state imbalance (rank -1); otherwise (suspected,
        recovered, healthy) rank -1, stage and cause "none", since_step -1, confidence 0,
        ratio 1."""
        p = self.primary
        subject = p if p is not None and p.state in ("straggler", "imbalance") else None
        return {
            VERDICT_STATUS: self.status,
            VERDICT_RANK: subject.rank if subject is not None else -1,
            VERDICT_STAGE: subject.stage if subject is not None else "none",
            VERDICT_CAUSE: subject.cause if subject is not None else "none",
            VERDICT_SINCE_STEP: subject.since_step if subject is not None else -1,
            VERDICT_CONFIDENCE: subject.confidence if subject is not None else 0.0,
            VERDICT_RATIO: subject.ratio if subject is not None else 1.0,
        }


@dataclass(frozen=True)
class _Report:
    step: int
    stages: tuple[str, ...]
    judged_ms: np.ndarray
    groups: Optional[np.ndarray]


class ConfirmedVerdict:
    """Feeds sampled reports, in step order, to the engine's confirmed-verdict tracker.

    rank_to_node: node id per rank, passed to the window ensemble (its anomalies then
    name nodes). Raises ValueError on an invalid config.
    """

    def __init__(self, config: Optional[ConfirmConfig] = None, rank_to_node: Optional[Sequence[int]] = None) -> None:
        self.config = config or ConfirmConfig()
        self._tracker = core().confirm.ConfirmTracker(self.config.native())
        self._window: Optional[WindowDetector] = None
        if self.config.window_every > 0:
            self._window = WindowDetector(window=self.config.window_size, every=self.config.window_every,
                                          skip_reports=self.config.window_skip, config=self.config.window_config,
                                          rank_to_node=rank_to_node)
        # Each report's run-queue wait beyond the group, per rank, for the reports a finding spans.
        self._run_queue: collections.deque[np.ndarray] = collections.deque(maxlen=self.config.history)
        # Each report's GC pauses, (ranks, len(GC_FIELDS)), for the reports a finding spans.
        self._gc: collections.deque[np.ndarray] = collections.deque(maxlen=self.config.history)
        # Each report's excess (ms) per listed (rank, stage), for the reports a finding spans.
        self._excess: collections.deque[dict[tuple[int, str], float]] = collections.deque(maxlen=self.config.history)
        self._stacks: dict[int, StackSample] = {}  # rank -> its latest sampled stack while it is confirmed
        self._confirmed_causes: dict[tuple[int, str], str] = {}  # (rank, stage) -> cause while listed
        # (rank, stage) -> (another cause its reports read, in how many reports in a row)
        self._cause_pending: dict[tuple[int, str], tuple[str, int]] = {}

    def update(self, step: int, ms: np.ndarray, stages: Sequence[str], groups: Optional[Sequence[int]] = None,
               workload: Optional[Sequence[float]] = None, kernel: Optional[KernelMatrix] = None,
               run_queue_ms: Optional[Sequence[float]] = None,
               gc: Optional[GcPauseRows] = None,
               stacks: Optional[Mapping[int, StackSample]] = None) -> VerdictResult:
        """Judges one report. kernel: the report's kernel records in the cells of `ms` (ms,
        NaN = not measured; with a workload, per token as ms is) or None. run_queue_ms: (ranks,)
        each rank's training thread's wait for a CPU in the step, ms (NaN = not measured), or
        None (after reports with waits: not measured in this one). gc: each rank's garbage-collection pauses over the steps since its previous row
        (relax_straggler.common.payload.GcPauseRows, NaN = not measured), or None. stacks: rank -> its
        sampled stack, for the ranks whose sample arrived with this report; kept, and carried
        in the facts of its straggler findings, while the rank stays confirmed. Raises
        ValueError naming the malformed input."""
        ms = np.ascontiguousarray(ms, dtype=np.float64)
        stages = tuple(stages)
        if ms.ndim != 2 or ms.shape[1] != len(stages):
            raise ValueError(f"step {step}: ms has shape {ms.shape} for {len(stages)} stages")
        if kernel is not None:
            for name in ("kernel_ms", "idle_ms", "nccl_ms"):
                if np.shape(getattr(kernel, name)) != ms.shape:
                    raise ValueError(f"step {step}: kernel.{name} has shape {np.shape(getattr(kernel, name))}, "
                                     f"ms has {ms.shape}")
        # Plain lists of Python numbers, converted in C (a comprehension over numpy scalars
        # cost more than the tracker itself at 1,024 ranks).
        group_list = None if groups is None else np.asarray(groups, dtype=np.int64).tolist()
        tokens = None if workload is None else np.asarray(workload, dtype=np.float64).tolist()
        C = core().confirm
        evidence = None
        window_result: Optional[WindowResult] = None
        if self._window is not None:
            judged = ms if tokens is None else _per_token(ms, stages, tokens)
            report = _Report(int(step), stages, judged, None if group_list is None else np.asarray(group_list))
            if self._window.observe(report):
                window_result = self._window.last_result
                evidence = C.WindowEvidence(int(step), [C.WindowRank(a.rank, a.votes, list(a.stages))
                                                        for a in window_result.anomalies],
                                            list(window_result.link_suspects))
        r = self._tracker.update(ms, list(stages), int(step), group_list, tokens, evidence)
        findings = tuple(_with_untimed_cause(_finding(f)) for f in r.findings)
        if r.reset:
            self._excess.clear()
        self._excess.append({(f.rank, f.stage): f.facts.excess_ms for f in findings if f.rank >= 0})
        if run_queue_ms is None and self._run_queue and not r.reset:
            run_queue_ms = np.full(ms.shape[0], np.nan)  # a report without waits keeps its place in their history
        if run_queue_ms is not None:
            findings = self._with_run_queue(step, findings, run_queue_ms, group_list, ms.shape[0], r.reset)
        if gc is not None:
            findings = self._with_gc(step, findings, gc, group_list, ms.shape[0], r.reset)
        if kernel is not None:  # refines what is still "compute"
            findings = tuple(_with_kernel_cause(f, kernel, stages, group_list) for f in findings)
        findings = self._with_stacks(findings, stacks or {}, r.reset)
        findings = self._with_confirmed_cause(findings, r.reset)
        return VerdictResult(step=r.step, status=C.state_name(r.status), findings=findings,
                             unjudged_ranks=tuple(r.unjudged_ranks), reports=r.reports, reset=r.reset,
                             window=window_result)

    def reset(self) -> None:
        """Forgets every report (a new run)."""
        self._tracker.reset()
        self._run_queue.clear()
        self._gc.clear()
        self._excess.clear()
        self._stacks.clear()
        self._confirmed_causes.clear()
        self._cause_pending.clear()
        if self._window is not None:
            self._window = WindowDetector(window=self._window.window, every=self._window.every,
                                          skip_reports=self._window.skip_reports, config=self.config.window_config,
                                          rank_to_node=self._window.rank_to_node)

    def _with_stacks(self, findings: tuple[Finding, ...], stacks: Mapping[int, StackSample],
                     reset: bool) -> tuple[Finding, ...]:
        """The straggler findings with their rank's sampled stack; a rank no longer confirmed
        forgets it."""
        if reset:
            self._stacks.clear()
        self._stacks.update(stacks)
        confirmed = {f.rank for f in findings if f.state == "straggler" and f.rank >= 0}
        self._stacks = {rank: s for rank, s in self._stacks.items() if rank in confirmed}
        if not self._stacks:
            return findings
        return tuple(dataclasses.replace(f, facts=dataclasses.replace(f.facts, stack=self._stacks[f.rank]))
                     if f.state == "straggler" and f.rank in self._stacks else f for f in findings)

    def _with_confirmed_cause(self, findings: tuple[Finding, ...], reset: bool) -> tuple[Finding, ...]:
        """The findings with the cause each listed one shows (the module's docstring): the
        cause its reports read, changed only once another has been read in confirm_reports
        reports in a row that show its excess; a recovered one, and a straggler in a report
        that does not show its excess, keep it. A (rank, stage) no longer listed is forgotten."""
        if reset:
            self._confirmed_causes.clear()
            self._cause_pending.clear()
        listed, pending = {}, {}
        for f in findings:
            if f.rank < 0 or f.state not in ("straggler", "recovered"):
                continue
            key = (f.rank, f.stage)
            shown = self._confirmed_causes.get(key)
            if shown is None:
                listed[key] = f.cause
            elif f.state == "recovered" or not _shows_excess(f) or f.cause == shown:
                listed[key] = shown
            else:
                cause, reports = self._cause_pending.get(key, (f.cause, 0))
                reports = reports + 1 if cause == f.cause else 1
                if reports >= self.config.confirm_reports:
                    listed[key] = f.cause
                else:
                    listed[key], pending[key] = shown, (f.cause, reports)
        self._confirmed_causes, self._cause_pending = listed, pending
        return tuple(dataclasses.replace(f, cause=listed[(f.rank, f.stage)]) if f.rank >= 0 and
                     (f.rank, f.stage) in listed else f for f in findings)

    def _typical_excess(self, f: Finding) -> float:
        """The finding's excess (ms) over its recent reports (reports_seen, at most history),
        their median: what its wait for a CPU over the same reports is compared with, not one
        report's noisy excess (nor the few reports with evidence, which are its largest)."""
        span = list(self._excess)[-max(1, min(f.facts.reports_seen, len(self._excess))):]
        values = [d[(f.rank, f.stage)] for d in span if (f.rank, f.stage) in d]
        values = [v for v in values if math.isfinite(v)]
        return float(np.median(values)) if values else float("nan")

    def _with_run_queue(self, step: int, findings: tuple[Finding, ...], run_queue_ms: Sequence[float],
                        groups: Optional[list[int]], ranks: int, reset: bool) -> tuple[Finding, ...]:
        """The findings with their run-queue facts and, where the wait explains the excess,
        the cause host_contention (HOST_CONTENTION_SHARE, the module's docstring)."""
        wait = np.asarray(run_queue_ms, dtype=np.float64)
        if wait.shape != (ranks,):
            raise ValueError(f"step {step}: run_queue_ms has shape {wait.shape}, expected ({ranks},)")
        if reset or (self._run_queue and self._run_queue[-1].shape != wait.shape):
            self._run_queue.clear()
        self._run_queue.append(beyond_group(wait, groups))
        recent = np.array(self._run_queue)  # (reports, ranks), oldest first
        out = []
        for f in findings:
            if f.rank < 0:
                out.append(f)
                continue
            span = recent[-max(1, min(f.facts.reports_seen, len(recent))):, f.rank]
            excess = float(np.median(span)) if np.isfinite(span).all() else float("nan")
            facts = dataclasses.replace(f.facts, run_queue_ms=float(wait[f.rank]), run_queue_excess_ms=excess)
            typical = self._typical_excess(f)
            contended = (f.cause in _CONTENDABLE and excess > 0 and typical > 0
                         and excess >= HOST_CONTENTION_SHARE * typical)
            out.append(dataclasses.replace(f, facts=facts, cause="host_contention" if contended else f.cause))
        return tuple(out)

    def _with_gc(self, step: int, findings: tuple[Finding, ...], gc: GcPauseRows,
                 groups: Optional[list[int]], ranks: int, reset: bool) -> tuple[Finding, ...]:
        """The findings with their GC facts and, where the pauses explain the excess, the
        cause gc (GC_SHARE, the module's docstring)."""
        rows = gc.matrix()
        if rows.shape != (ranks, len(GC_FIELDS)):
            raise ValueError(f"step {step}: gc has shape {rows.shape}, expected ({ranks}, {len(GC_FIELDS)})")
        if reset or (self._gc and self._gc[-1].shape != rows.shape):
            self._gc.clear()
        self._gc.append(rows)
        recent = np.array(self._gc)  # (reports, ranks, fields), oldest first
        beyond: dict[int, np.ndarray] = {}  # per span of reports: pause ms per step beyond the group
        in_step = rows[:, GC_FIELDS.index("gc_step_ms")]
        this_step = beyond_group(in_step, groups)
        out = []
        for f in findings:
            if f.rank < 0:
                out.append(f)
                continue
            span = max(1, min(f.facts.reports_agreeing, len(recent)))
            pooled = recent[-span:].sum(axis=0)  # NaN where a report did not measure the rank
            if span not in beyond:
                beyond[span] = beyond_group(gc_per_step(pooled), groups)
            mine = {name: float(pooled[f.rank, i]) for i, name in enumerate(GC_FIELDS) if name != "gc_step_ms"}
            facts = dataclasses.replace(f.facts, gc_excess_ms=float(beyond[span][f.rank]),
                                        gc_step_ms=float(in_step[f.rank]),
                                        gc_step_excess_ms=float(this_step[f.rank]), **mine)
            excess = float(np.fmax(facts.gc_excess_ms, facts.gc_step_excess_ms))  # NaN: neither measured
            over = f.cause in _CONTENDABLE or (f.cause == "host_contention" and excess > f.facts.run_queue_excess_ms)
            # The pooled pauses against the finding's typical excess, the sampled step's against its own.
            typical = self._typical_excess(f)
            by_steps = facts.gc_excess_ms > 0 and typical > 0 and facts.gc_excess_ms >= GC_SHARE * typical
            on_step = (facts.gc_step_excess_ms > 0 and _shows_excess(f)
                       and facts.gc_step_excess_ms >= GC_SHARE * f.facts.excess_ms)
            paused = over and (by_steps or on_step)
            out.append(dataclasses.replace(f, facts=facts, cause="gc" if paused else f.cause))
        return tuple(out)


def _shows_excess(f: Finding) -> bool:
    """Whether the latest report shows the finding's slowdown (an excess on the slow side): a
    cause is read from such a report only; in one without it (still listed until the release)
    the cause stays the one its evidence gave, since half of no excess explains nothing."""
    return f.facts.excess_ms > 0


def gc_per_step(pooled: np.ndarray) -> np.ndarray:
    """Each rank's garbage-collection pause time per step, ms: pooled (ranks, len(GC_FIELDS))
    sums of GC_FIELDS over some reports; NaN where not measured or covering no step."""
    ms = pooled[:, GC_FIELDS.index("gc_ms")]
    steps = pooled[:, GC_FIELDS.index("gc_steps")]
    covered = np.isfinite(ms) & (steps > 0)
    return np.divide(ms, steps, out=np.full(ms.shape, np.nan), where=covered)


def beyond_group(wait_ms: np.ndarray, groups: Optional[Sequence[int]] = None) -> np.ndarray:
    """Each rank's wait beyond the median of the other ranks of its comparison group (all
    ranks when groups is None), ms. wait_ms: (ranks,) float64, NaN = not measured; groups:
    one group id per rank. NaN where the rank or all its peers were not measured. One sort
    of the measured ranks by (group, wait); each rank's median of the others is read from
    its group's sorted run, one or two places shifted past its own."""
    wait = np.asarray(wait_ms, dtype=np.float64)
    ids = np.zeros(wait.shape, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    if ids.shape != wait.shape:
        raise ValueError(f"run-queue waits of {wait.shape[0]} ranks with {ids.shape[0]} group ids")
    out = np.full(wait.shape, np.nan)
    measured = np.flatnonzero(np.isfinite(wait))
    if measured.size == 0:
        return out
    order = np.lexsort((wait[measured], ids[measured]))
    g, v = ids[measured][order], wait[measured][order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    sizes = np.diff(np.r_[starts, g.size])
    start = np.repeat(starts, sizes)
    pos = np.arange(g.size) - start  # own place in its group's sorted run
    others = np.repeat(sizes, sizes) - 1

    def other(j: np.ndarray) -> np.ndarray:  # the j-th smallest of the others (a rank alone: itself)
        return v[start + np.minimum(np.where(j < pos, j, j + 1), others)]

    k = others // 2
    odd = others % 2 == 1
    median = np.where(odd, other(k), (other(np.maximum(k - 1, 0)) + other(k)) / 2)
    beyond = np.where(others >= 1, v - median, np.nan)
    out[measured[order]] = beyond
    return out


def _per_token(ms: np.ndarray, stages: tuple[str, ...], tokens: Sequence[float]) -> np.ndarray:
    # The window sees what the tracker compares: work stages at the mean token count.
    workload = np.asarray(tokens, dtype=np.float64)
    if workload.shape != (ms.shape[0],) or not np.all(np.isfinite(workload) & (workload > 0)):
        raise ValueError(f"workload must hold one finite value > 0 per rank ({ms.shape[0]})")
    return normalize_workload(ms, stages, workload)


def _with_untimed_cause(f: Finding) -> Finding:
    """`f` with cause untimed_code where the engine judged the measured `untimed` stage (the
    step's time outside every timed section, judged as compute): the rank's own code between
    sections, which no section names."""
    if f.stage == "untimed" and f.cause == "compute":
        return dataclasses.replace(f, cause="untimed_code")
    return f


def _with_kernel_cause(f: Finding, kernel: KernelMatrix, stages: tuple[str, ...],
                       groups: Optional[list[int]]) -> Finding:
    """`f` with its kernel facts and, for a compute cause, the cause the kernel records
    support (csrc/core/confirm/kernel_cause.h); imbalance findings (rank -1) unchanged."""
    if f.rank < 0:
        return f
    K = core().kernels
    j = stages.index(f.stage)
    rows = range(kernel.kernel_ms.shape[0]) if groups is None else [i for i, g in enumerate(groups) if g == f.group]
    rows = list(rows)
    times = [K.KernelTimes(float(kernel.kernel_ms[i, j]), float(kernel.idle_ms[i, j]), float(kernel.nccl_ms[i, j]))
             for i in rows]
    r = K.kernel_cause(times, rows.index(f.rank))
    facts = dataclasses.replace(f.facts, kernel=KernelFacts(
        kernel_ms=r.rank.kernel_ms, idle_ms=r.rank.idle_ms, nccl_ms=r.rank.nccl_ms,
        ref_kernel_ms=r.reference.kernel_ms, ref_idle_ms=r.reference.idle_ms, ref_nccl_ms=r.reference.nccl_ms,
        peers=r.peers))
    cause = r.cause if f.cause == "compute" and r.cause != "unknown" else f.cause
    return dataclasses.replace(f, facts=facts, cause=cause)


def _finding(f: Any) -> Finding:
    C = core().confirm
    x = f.facts
    facts = Facts(rank_ms=x.rank_ms, ref_ms=x.ref_ms, excess_ms=x.excess_ms, median_ratio=x.median_ratio, noise=x.noise,
                  wait_caused_ms=x.wait_caused_ms, waiting_ranks=tuple(x.waiting_ranks),
                  reports_agreeing=x.reports_agreeing, reports_seen=x.reports_seen, window_votes=x.window_votes)
    return Finding(rank=f.rank, group=f.group, stage=f.stage_name, state=C.state_name(f.state),
                   since_step=f.since_step, confidence=f.confidence, ratio=f.ratio, persistent=f.persistent,
                   by_window=f.by_window, facts=facts, cause=C.cause_name(f.cause), by_sequential=f.by_sequential)

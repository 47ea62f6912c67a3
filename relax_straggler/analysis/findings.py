"""What the offline analysis concludes (analysis/result.py's typed values) from a RunResult:
findings grouped per worker, pipeline stage or link, each with readable evidence; the
verdict; per-rank scores; what the input cannot conclude.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Optional

import numpy as np

from relax_straggler.analysis.engine import COLLECTIVE_STAGES, COMPUTE_STAGES, RunResult
from relax_straggler.analysis.minmax import LIMITATIONS as MINMAX_LIMITATIONS
from relax_straggler.window.ensemble import EnsembleVotes
from relax_straggler.analysis.result import (Analysis, Anomaly, BaselineOutlier, InputFacts, Jump, LateArrivalCount,
                                             PipelineEvidence, RankScores, StageDetail, Verdict)
from relax_straggler.common.stages import STAGES
from relax_straggler.common.topology import Topology

# Each anomaly kind in words: the anomaly's `cause` text. The kinds are the offline
# attribution's own (which worker, stage or link); a cause name of the confirmed verdict
# is one of relax_straggler.judge.confirm.CAUSES.
KIND_EXPLANATIONS = {
    "individual": "this worker computes slower than its data-parallel replicas (device, thermals, host)",
    "structural": "every data-parallel replica of this pipeline stage is slower: stage partitioning imbalance",
    "link": "the pipeline link between two workers (both ends wait, neither computes slowly)",
    "send_side": "this worker's send side (its receiver shows no wait)",
    "recv_side": "this worker's receive side (its sender shows no wait)",
    "node_network": "every pipeline transfer of this worker is slow: its node's network",
    "p2p_slow_steps": "this worker's pipeline transfers grow in the slow steps (PP = 2: no neighbour to cross-check)",
}


class _Workers:
    def __init__(self, topo: Topology, seen: np.ndarray) -> None:
        self.topo, self.seen = topo, seen

    def coords(self, worker: int) -> tuple[int, int]:
        return worker % self.topo.dp, worker // self.topo.dp

    def ranks(self, worker: int) -> list[int]:
        return self.topo.worker_ranks(*self.coords(worker))

    def recorded(self, worker: int) -> list[int]:
        return [r for r in self.ranks(worker) if self.seen[r]]

    def nodes(self, ranks: list[int]) -> list[int]:
        return sorted({n for n in (self.topo.node_of(r) for r in ranks) if n is not None})

    def name(self, worker: int) -> str:
        d, p = self.coords(worker)
        return f"dp {d} / pp {p}"


def _group(findings: list, workers: _Workers, result: RunResult) -> list[Anomaly]:
    """One anomaly per worker (worker kinds), pipeline stage (structural) or link."""
    groups: dict[tuple, list] = defaultdict(list)
    for f in findings:
        if f.kind == "structural":
            groups[("structural", f.pp_rank)].append(f)
        elif f.kind == "link":
            groups[("link", f.worker, f.peer_worker)].append(f)
        else:
            groups[(f.kind, f.worker)].append(f)
    topo, steps = workers.topo, result.steps
    out = []
    for key, fs in groups.items():
        kind = key[0]
        details = tuple(StageDetail(COMPUTE_STAGES[f.stage] if f.stage >= 0 else (f.op or "p2p"), f.mean_ratio,
                                    f.max_ratio, f.mean_excess_ms, f.steps_flagged, f.first_step, f.last_step)
                        for f in fs)
        if kind == "structural":
            ws = [topo.dp * key[1] + d for d in range(topo.dp)]
            dp_rank, pp_rank = None, key[1]
        elif kind == "link":
            ws = [key[1], key[2]]
            dp_rank, pp_rank = workers.coords(key[1])[0], None
        else:
            ws = [key[1]]
            dp_rank, pp_rank = workers.coords(key[1])
        ranks = [r for w in ws for r in workers.ranks(w)]
        recorded = [r for w in ws for r in workers.recorded(w)]
        evidence = [_detail_line(kind, d, topo, steps) for d in details]
        if kind in ("individual", "structural"):
            waits = fs[0].waits_explained  # counted per worker (stage), the same on each of its findings
            if waits:
                evidence.append(f"{waits} pipeline send/recv waits of other workers trace back to "
                                f"{'this worker' if kind == 'individual' else 'this stage'}")
            evidence += _late_lines(ws, result)
        evidence += _ensemble_lines(ranks, result.ensemble)
        if kind == "link":
            evidence.append(f"between {workers.name(key[1])} and {workers.name(key[2])}: both ends of the transfer "
                            "wait and neither side's compute explains it")
        out.append(Anomaly(
            kind=kind, cause=KIND_EXPLANATIONS[kind], dp_rank=dp_rank, pp_rank=pp_rank,
            ranks=tuple(ranks), recorded_ranks=tuple(recorded), nodes=tuple(workers.nodes(ranks)),
            stages=tuple(d.stage for d in details),
            steps_flagged=max(d.steps_flagged for d in details), steps_total=steps,
            mean_ratio=max(d.mean_ratio for d in details), excess_ms=max(d.mean_excess_ms for d in details),
            details=details, evidence=tuple(evidence),
        ))
    out.sort(key=lambda a: (-a.steps_flagged, -a.excess_ms))
    return out


def _detail_line(kind: str, d: StageDetail, topo: Topology, steps: int) -> str:
    share = f"in {d.steps_flagged}/{steps} steps"
    if kind == "individual":
        # With two replicas the reference is the other one (csrc/core/attribute/classify.cpp).
        ref = "its data-parallel peer" if topo.dp == 2 else f"the median of the {topo.dp} data-parallel replicas"
        return f"{d.stage}: {d.mean_ratio:.2f}x {ref}, +{d.mean_excess_ms:.1f} ms per step, {share}"
    if kind == "structural":
        return (f"{d.stage}: every replica of the stage at {d.mean_ratio:.2f}x the median pipeline stage, "
                f"+{d.mean_excess_ms:.1f} ms per step, {share}")
    what = "all p2p ops" if kind == "node_network" else d.stage
    ref = "its own time in fast steps" if kind == "p2p_slow_steps" else "the fastest worker"
    return f"{what}: {d.mean_ratio:.2f}x {ref}, +{d.mean_excess_ms:.1f} ms per step, {share}"


def _late_lines(workers: list[int], result: RunResult) -> list[str]:
    lines = []
    for j, stage in enumerate(COLLECTIVE_STAGES):
        n = int(result.late_arrivals[workers, j].sum())
        if n:
            lines.append(f"arrives last at {stage} in {n} worker-steps: its data-parallel peers wait for it "
                         "(they show the long times)")
    return lines


def _ensemble_lines(ranks: list[int], ensemble: Optional[EnsembleVotes]) -> list[str]:
    if ensemble is None or ensemble.error is not None:
        return []
    voted = {r: ensemble.votes[r] for r in ranks if r in ensemble.votes}
    if not voted:
        return [f"ensemble window detector ({ensemble.algorithms} clusterers, last {ensemble.steps} steps): "
                "no vote for these ranks"]
    return [f"ensemble window detector: rank {r} voted slow by {v} of {ensemble.algorithms} clusterers"
            for r, v in voted.items()]


def _per_rank(result: RunResult) -> RankScores:
    """The recorded ranks' scores, as columns (no object per rank)."""
    topo, stats = result.topology, result.stats
    ranks = np.flatnonzero(result.seen_ranks)
    total = stats.mean_total_slowdown()[ranks]
    overall = np.where(np.isfinite(total) & (total > 0), total, 1.0)
    dp, pp, tp = topo.coords(ranks)
    node = ranks // topo.ranks_per_node if topo.ranks_per_node is not None else np.full(ranks.size, -1)
    return RankScores(ranks.astype(np.int64), dp.astype(np.int64), pp.astype(np.int64), tp.astype(np.int64),
                      node.astype(np.int64), np.minimum(1.0, 1.0 / overall), overall, stats.mean_slowdown()[ranks],
                      stats.mean_ms()[ranks], COMPUTE_STAGES, STAGES)


def _limitations(result: RunResult) -> tuple[str, ...]:
    out = []
    topo = result.topology
    if topo is not None:
        if result.source.topology() is None:
            out.append("no parallel layout in the input: every rank is compared with every other as a data-parallel "
                       "peer; give --dp/--pp/--tp/--dsp for pipeline and structural analysis")
        if topo.dp == 1:
            out.append("dp = 1: no replica to compare a worker with, so a slow worker cannot be told from a slow "
                       "pipeline stage (reported as structural)")
        if topo.pp == 1 and result.source.topology() is not None:
            out.append("pp = 1: no pipeline, so no send/recv cross-validation and no structural imbalance")
        elif topo.pp >= 2 and not result.has_p2p:
            out.append("the input has no pipeline send/recv times: waits cannot be cross-validated")
        if topo.ranks_per_node is None:
            out.append("no --ranks-per-node: nodes are not named")
        if not np.isfinite(result.step_ms).any():
            out.append("no measured step time: the impact rule uses the largest per-worker compute sum")
    if result.minmax.steps:
        out += list(MINMAX_LIMITATIONS)
        if result.minmax.max_only:
            out.append("max-only timer blocks: not even the spread between ranks is known")
    return tuple(out)


# Fewer steps than this leave persistence meaningless (one step is "1 of 1").
MIN_STEPS = 3


def _unusable(result: RunResult) -> Optional[Verdict]:
    """An inconclusive verdict when the input cannot support one (the CLI exits 1), else None:
    too much of it skipped (readers/base.py Problems.unusable), or too few steps."""
    why = result.source.problems.unusable(result.source.records)
    if why is not None:
        return Verdict("inconclusive", f"{why} (see input.problems): fix the input or the layout flags "
                                       "(--dp/--pp/--tp/--dsp, --meta) before reading a verdict", "rejected_input")
    if result.topology is not None and result.steps < MIN_STEPS:
        return Verdict("inconclusive", f"only {result.steps} step(s): a persistent finding needs at least {MIN_STEPS}",
                       "too_few_steps")
    return None


def _verdict(anomalies: list[Anomaly], result: RunResult) -> Verdict:
    unusable = _unusable(result)
    if unusable is not None:
        return unusable
    individual = [a for a in anomalies if a.kind != "structural"]
    structural = [a for a in anomalies if a.kind == "structural"]
    parts = []
    for a in individual:
        where = f"dp {a.dp_rank} / pp {a.pp_rank}" if a.pp_rank is not None else f"dp {a.dp_rank}"
        what = "individual straggler" if a.kind == "individual" else a.kind.replace("_", " ")
        parts.append(f"{what} {where} (ranks {format_ranks(list(a.ranks))}) in {', '.join(a.stages)}, "
                     f"mean {a.mean_ratio:.2f}x")
    for a in structural:
        parts.append(f"pipeline stage {a.pp_rank} structurally slow in {', '.join(a.stages)}, mean {a.mean_ratio:.2f}x")
    if individual:
        status = "stragglers"
    elif structural:
        status = "imbalance"
    elif result.topology is None:
        status = "inconclusive"
        spread = [s["stage"] for s in result.minmax.stages(result.config.relative_threshold,
                                                           result.config.absolute_ms_threshold) if s.get("spread")]
        parts.append("min/max-only input: " + (f"ranks differ in {', '.join(spread)}, but no rank can be named"
                                                if spread else "no stage shows a spread between ranks"))
    else:
        status = "clean"
        parts.append(f"no persistent straggler or imbalance in {result.steps} steps")
    return Verdict(status, "; ".join(parts))


def format_ranks(ranks: list[int]) -> str:
    """"4-7" for a run of three or more consecutive ranks, else "4, 9" (at most 8 listed)."""
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks[:8]) + (", ..." if len(ranks) > 8 else "")


def _input(result: RunResult) -> InputFacts:
    src, topo = result.source, result.topology
    names = getattr(src, "names", None)
    return InputFacts(
        path=src.path, format=src.format, records=src.records, steps=result.steps,
        min_max_steps=result.minmax.steps,
        ranks=int(result.seen_ranks.sum()),
        topology=None if topo is None else {**topo.facts(), "declared": src.topology() is not None},
        median_step_ms=float(np.median(result.step_ms)) if result.step_ms.size else None,
        per_token=result.per_token,
        problems=src.problems.facts(src.records),
        excluded_ops=dict(names.excluded) if names is not None else {},
        unknown_ops=dict(names.unknown) if names is not None else {},
    )


def build_analysis(result: RunResult) -> Analysis:
    """The typed answer of a RunResult (findings grouped per worker, stage or link; the
    verdict; the per-rank scores)."""
    anomalies: list[Anomaly] = []
    transient: list[Anomaly] = []
    pipeline = PipelineEvidence()
    late: list[LateArrivalCount] = []
    per_rank = RankScores.empty(COMPUTE_STAGES, STAGES)
    if result.run is not None:
        workers = _Workers(result.topology, result.seen_ranks)
        anomalies = _group([f for f in result.run.findings if f.persistent], workers, result)
        transient = _group([f for f in result.run.findings if not f.persistent], workers, result)
        run = result.run
        pipeline = PipelineEvidence(
            jumps=len(run.jumps),
            first_jumps=tuple(Jump(j.step, workers.name(j.worker), j.op, j.ms, j.previous_ms) for j in run.jumps[:20]),
            baseline_outliers=tuple(BaselineOutlier(workers.name(b.worker), tuple(workers.ranks(b.worker)), b.op,
                                                    b.mean_ms, b.baseline_ms, b.steps_abnormal, b.steps_explained)
                                    for b in run.baseline_outliers),
            slow_steps=tuple(run.slow_steps),
        )
        for w, j in zip(*np.nonzero(result.late_arrivals)):
            late.append(LateArrivalCount(workers.name(int(w)), tuple(workers.ranks(int(w))), COLLECTIVE_STAGES[j],
                                         int(result.late_arrivals[w, j])))
        late.sort(key=lambda x: -x.steps)
        per_rank = _per_rank(result)
    return Analysis(
        input=_input(result),
        verdict=_verdict(anomalies, result),
        anomalies=tuple(anomalies),
        transient=tuple(transient),
        pipeline=pipeline,
        late_arrivals=tuple(late),
        per_rank=per_rank,
        ensemble=result.ensemble,
        confirmed=result.confirmed,
        min_max=None if result.minmax.steps == 0 else {
            "steps": result.minmax.steps,
            "stages": result.minmax.stages(result.config.relative_threshold, result.config.absolute_ms_threshold)},
        limitations=_limitations(result),
    )

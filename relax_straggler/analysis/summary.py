"""The analysis (analysis/result.py) rendered as one JSON-ready dict: the --format json
output and the input of the terminal report and the heatmap.

    {"input":       path, format, records, steps, ranks, topology, problems, op names excluded/unknown,
     "verdict":     {"status": stragglers | imbalance | clean | inconclusive, "summary": str},
     "anomalies":   persistent findings, one per worker / pipeline stage / link,
     "transient":   findings that held in fewer than persistence x steps,
     "pipeline":    jumps, baseline outliers, slow steps of the PP = 2 fallback,
     "late_arrivals": collective late arrivals per worker (docs/ARCHITECTURE.md invariant 7),
     "per_rank":    rank, dp, pp, tp, node, score (0..1, lower is slower) = 1 / compute_slowdown (its
                    compute ms over its replicas' median, time-weighted over the compute stages),
                    slowdown and mean ms per stage,
     "ensemble":    the six-clusterer window detector's votes (--ensemble-steps), or null,
     "confirmed":   the live analyzer's confirmed verdict over the steps: statuses (steps per
                    state), final_status, stragglers [{rank, stage, since_step, steps,
                    median_ratio, cause}], or null,
     "min_max":     stage spreads of min/max-only logs, or null,
     "limitations": what this input cannot conclude,
     "whatif":      (inputs with per-op records, added by analysis/whatif.py) the what-if replay's
                    slowdown S, top_worker {dp_rank, stage, score}, give_back (M_W), m_s,
                    simulation_error, summary; or {"error": why it could not replay}}

Times are ms per step. Each anomaly: kind, cause, dp_rank, pp_rank, ranks (every rank of the
worker by the topology, with its tensor-parallel ranks), recorded_ranks (those in the
input), nodes, stages (compute stages or p2p ops), steps_flagged, steps_total, ratio
(largest mean ratio over its stages), excess_ms (largest mean excess), details per stage,
evidence (readable lines).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from relax_straggler.analysis.engine import RunResult
from relax_straggler.analysis.findings import build_analysis
from relax_straggler.analysis.result import Analysis, RankScore, Verdict
from relax_straggler.serialization import json_safe


def build_summary(result: RunResult) -> dict:
    """The JSON-ready summary of a run (NaN and inf become null)."""
    return summary_dict(build_analysis(result))


def summary_dict(analysis: Analysis) -> dict:
    """The JSON-ready form of `analysis` (NaN and inf become null; tuples become lists)."""
    summary = json_safe({
        "input": _fields(analysis.input),
        "verdict": verdict_dict(analysis.verdict),
        "anomalies": [_fields(a) for a in analysis.anomalies],
        "transient": [_fields(a) for a in analysis.transient],
        "pipeline": _fields(analysis.pipeline),
        "late_arrivals": [_fields(x) for x in analysis.late_arrivals],
        "per_rank": [],
        "ensemble": None if analysis.ensemble is None else analysis.ensemble.to_dict(),
        "confirmed": _fields(analysis.confirmed),
        "min_max": analysis.min_max,
        "limitations": list(analysis.limitations),
    })
    summary["per_rank"] = [_rank(r) for r in analysis.per_rank]  # finite by construction: no json_safe pass
    return summary


def _fields(x: Any) -> Any:
    """A dataclass as a dict of its fields, recursively (dataclasses.asdict without its deep
    copy of every value)."""
    if dataclasses.is_dataclass(x):
        return {f.name: _fields(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, (list, tuple)):
        return [_fields(v) for v in x]
    return x


def verdict_dict(v: Verdict) -> dict:
    """{"status", "summary"} and, for inconclusive input, "reason"."""
    out = {"status": v.status, "summary": v.summary}
    if v.reason is not None:
        out["reason"] = v.reason
    return out


def _rank(r: RankScore) -> dict:
    return {"rank": r.rank, "dp_rank": r.dp_rank, "pp_rank": r.pp_rank, "tp_rank": r.tp_rank, "node": r.node,
            "score": r.score, "compute_slowdown": r.compute_slowdown, "slowdown": r.slowdown, "mean_ms": r.mean_ms}

"""The analysis (analysis/result.py) rendered as one JSON-ready dict: the --format json
output and the input of the terminal report.

    {"input":       path, format, records, steps, ranks, topology, problems, op names excluded/unknown,
     "verdict":     {"status": stragglers | imbalance | clean | inconclusive, "summary": str}:
                    derived from the anomalies, the confirmed verdict and the what-if figures
                    below (analysis/headline.py), never against them,
     "anomalies":   persistent findings, one per worker / pipeline stage / link,
     "transient":   findings that held in fewer than persistence x steps,
     "pipeline":    jumps, baseline outliers, slow steps of the PP = 2 fallback,
     "late_arrivals": collective late arrivals per worker (docs/ARCHITECTURE.md invariant 7),
     "per_rank":    rank, dp, pp, tp, node, score (0..1, lower is slower) = 1 / compute_slowdown (its
                    compute ms over its replicas' median, with two the other one, time-weighted
                    over the compute stages), slowdown and mean ms per stage,
     "ensemble":    the six-clusterer window detector's votes (--ensemble-steps), or null,
     "confirmed":   the live analyzer's confirmed verdict over the steps: statuses (steps per
                    state), final_status, stragglers [{rank, stage, since_step, steps,
                    ratio (the finding's, docs/METRICS.md), cause}], imbalance [{group,
                    stage, since_step, steps, ratio}], or null,
     "min_max":     stage spreads of min/max-only logs, or null,
     "limitations": what this input cannot conclude,
     "whatif":      (inputs with per-op records, added by analysis/whatif.py) the what-if replay's
                    slowdown S, top_worker {dp_rank, stage, score}, give_back (M_W), m_s,
                    simulation_error, summary; or {"error": why it could not replay}}

Times are ms per step. Each anomaly: kind, cause, dp_rank, pp_rank, ranks (every rank of the
worker by the topology, with its tensor-parallel ranks), recorded_ranks (those in the
input), nodes, stages (compute stages or p2p ops), steps_flagged, steps_total, mean_ratio
(largest mean ratio over its stages), excess_ms (largest mean excess), details per stage,
evidence (readable lines).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterator, Optional, TextIO

import numpy as np
import orjson

from relax_straggler.analysis.config import AnalyzeConfig
from relax_straggler.analysis.engine import RunResult
from relax_straggler.analysis.findings import build_analysis
from relax_straggler.analysis.headline import headline
from relax_straggler.analysis.result import Analysis, RankScores, Verdict
from relax_straggler.common.serialization import json_safe


def build_summary(result: RunResult) -> dict:
    """The JSON-ready summary of a run (NaN and inf become null)."""
    return summary_dict(build_analysis(result), min_impact=result.config.min_impact)


def summary_dict(analysis: Analysis, slowest: Optional[int] = None, whatif: Optional[dict] = None,
                 min_impact: float = AnalyzeConfig.min_impact) -> dict:
    """The JSON-ready form of `analysis` (NaN and inf become null; tuples become lists).
    per_rank: every recorded rank's entry, or with `slowest` only that many of the lowest
    scores (what the terminal report shows; the command line writes every entry straight
    from analysis.per_rank, write_summary, never holding a dict per rank). whatif: the
    what-if figures (analysis/whatif.py) to add as "whatif", or None. The verdict is derived
    from everything listed (analysis/headline.py); min_impact: AnalyzeConfig.min_impact."""
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
    if whatif is not None:
        summary["whatif"] = json_safe(whatif)
    summary["verdict"] = headline(summary["verdict"], summary["confirmed"], summary.get("whatif"), min_impact)
    scores = analysis.per_rank if slowest is None else analysis.per_rank.slowest(slowest)
    summary["per_rank"] = list(per_rank_entries(scores))  # finite by construction: no json_safe pass
    return summary


def per_rank_entries(scores: RankScores, chunk: int = 1 << 12) -> Iterator[dict]:
    """The per_rank entries of `scores`, rank ascending: {rank, dp_rank, pp_rank, tp_rank,
    node, score, compute_slowdown, slowdown, mean_ms} (the last two: finite values per
    stage), made a chunk of ranks at a time."""
    for lo in range(0, len(scores), chunk):
        part = slice(lo, lo + chunk)
        columns = zip(*(getattr(scores, name)[part].tolist() for name in _SCALARS))
        slowdown = _stage_dicts(scores.compute_stages, scores.slowdown[part])
        mean_ms = _stage_dicts(scores.stages, scores.mean_ms[part])
        for (rank, dp, pp, tp, node, score, overall), sd, ms in zip(columns, slowdown, mean_ms):
            yield {"rank": rank, "dp_rank": dp, "pp_rank": pp, "tp_rank": tp, "node": None if node < 0 else node,
                   "score": score, "compute_slowdown": overall, "slowdown": sd, "mean_ms": ms}


def _stage_dicts(names: tuple[str, ...], values: np.ndarray) -> list[dict[str, float]]:
    """{stage: value} of each row of (rows, len(names)) values, finite values only; the
    columns without any are never visited (most inputs time a few of the stages)."""
    cols = np.flatnonzero(np.isfinite(values).any(axis=0))
    names, values = [names[c] for c in cols.tolist()], values[:, cols]
    if np.isfinite(values).all():
        return [dict(zip(names, row)) for row in values.tolist()]
    finite = math.isfinite
    return [{n: x for n, x in zip(names, row) if finite(x)} for row in values.tolist()]


_SCALARS = ("rank", "dp_rank", "pp_rank", "tp_rank", "node", "score", "compute_slowdown")


def write_summary(summary: dict, out: TextIO, per_rank: Optional[RankScores] = None) -> None:
    """Writes `summary` as JSON text on `out`, its per_rank entries those of `per_rank` when
    given (made as they are written): indented, each per_rank entry on one line, encoded one
    at a time by orjson, never the whole text in memory (a million entries indented in one
    string took 3 KB a rank; encoded by the standard library, 50 s on 2 busy cores, 3 s by
    orjson). Raises ValueError on a non-finite float (summary_dict has none)."""
    marker = "\0per_rank\0"
    head, tail = json.dumps({**summary, "per_rank": marker}, indent=2, allow_nan=False).split(json.dumps(marker))
    out.write(head + "[")
    entries = summary["per_rank"] if per_rank is None else per_rank_entries(per_rank)
    separator = "\n    "
    for entry in entries:
        out.write(separator + orjson.dumps(entry).decode())
        separator = ",\n    "
    out.write(("]" if separator == "\n    " else "\n  ]") + tail + "\n")


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

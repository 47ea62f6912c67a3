"""A job's current verdict, as the monitor exports it (the Prometheus info series, the status
page, the drain plan): one definition, from the job's status, its newest analysis and its
hang answer.

- detected: the newest analysis named a straggler rank -> that rank, its node (from the
  rows' node column), stage, cause, since step, ratio and excess. Its status is `confirmed`
  when the confirmed verdict over the window (or the job's own live verdict) names the same
  rank, else `suspected`.
- hanging with a hang answer naming a rank -> that rank, status `hanging`, stage
  `communication`, cause the answer's kind, since step the step the job stopped in.
- otherwise (active, slowdown, predicting, finished, hanging without a culprit): none. A
  finished job costs nothing any more, so nothing about it should page anyone.

At most one verdict per job: the exported series stay one per job (bounded cardinality).
"""

from __future__ import annotations

from typing import Optional

from relax_straggler.monitor.trigger import DETECTED, HANGING

CONFIRMED, SUSPECTED = "confirmed", "suspected"


def current_verdict(job_id: str, status: str, last_result: Optional[dict], hang_answer: Optional[dict],
                    node_of_rank: Optional[int] = None) -> Optional[dict]:
    """{"job_id", "rank", "node", "stage", "cause" (a word of the cause vocabulary, "unknown"
    when not confirmed), "explanation" (the analysis's sentence), "status", "since_step",
    "ratio" (the confirmed finding's ratio, docs/METRICS.md "Ratios and excesses"; None
    unless the window's confirmed verdict names the rank), "mean_ratio" (the window
    analysis's mean over its flagged steps), "excess_ms" (the rank's excess over its group
    per step, ms; None for a hang), "window" ([first, last] iterations analysed; None for a
    hang), "node_source" ("store": the rows' node column; "ranks_per_node":
    node-<rank // ranks_per_node> of the job's registered layout, used when the rows named
    no node; None: unknown, node "")} or None (see the module docstring). node_of_rank:
    rank // the job's ranks_per_node, if given."""
    if status == DETECTED and last_result is not None and last_result.get("straggler_rank") is not None:
        rank = int(last_result["straggler_rank"])
        confirmed = _confirmed_entry(last_result, rank)
        live = last_result.get("live_verdict") or {}
        live_names = live.get("status") == "straggler" and live.get("rank") == rank
        window = last_result.get("window") or {}
        since = confirmed["since_step"] if confirmed else window.get("first_iteration")
        # The cause vocabulary's word (compute, host_contention, ...), as the confirmed verdict
        # or the job's own gives it; the analysis's sentence is kept as the explanation.
        cause = confirmed["cause"] if confirmed else (live.get("cause") if live_names else None)
        return {"job_id": job_id, "rank": rank,
                **_node(last_result.get("straggler_node"), node_of_rank),
                "stage": last_result.get("stage") or "unknown",
                "cause": cause or "unknown", "explanation": last_result.get("cause"),
                "status": CONFIRMED if confirmed or live_names else SUSPECTED,
                "since_step": since, "ratio": confirmed["ratio"] if confirmed else None,
                "mean_ratio": last_result.get("mean_ratio"), "excess_ms": last_result.get("excess_ms"),
                "window": [window.get("first_iteration"), window.get("last_iteration")]}
    if status == HANGING and hang_answer and "error" not in hang_answer and int(hang_answer.get("rank", -1)) >= 0:
        return {"job_id": job_id, "rank": int(hang_answer["rank"]),
                **_node(hang_answer.get("node"), node_of_rank), "stage": "communication",
                "cause": str(hang_answer.get("kind") or "unknown"), "status": HANGING,
                "explanation": hang_answer.get("answer"),
                "since_step": hang_answer.get("step"), "ratio": None, "mean_ratio": None, "excess_ms": None,
                "window": None}
    return None


def _confirmed_entry(result: dict, rank: int) -> Optional[dict]:
    for entry in (result.get("confirmed") or {}).get("stragglers") or ():
        if entry.get("rank") == rank:
            return entry
    return None


def _node(named: Optional[str], index: Optional[int]) -> dict:
    if named:
        return {"node": named, "node_source": "store"}
    if index is not None:
        return {"node": f"node-{index}", "node_source": "ranks_per_node"}
    return {"node": "", "node_source": None}

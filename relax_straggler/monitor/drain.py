"""The drain plan: what an operator would run to take a confirmed straggler's node (or a hang's
culprit's) out of scheduling, with the evidence and what fixing it gives back. The monitor
only proposes it (GET /{job_id} "drain_plan", `relax-straggler drain-plan`); nothing here, or
anywhere in relax_straggler, runs a command.

Nodes come only from the job's rows (their node column) or, where the rows name none, from
rank // the ranks_per_node the job registered (verdict.py). Without either, the plan names
the ranks and gives no command. Every name put in a command is shell-quoted: node names and
job ids come from the store, and a plan is text someone may paste into a shell.
"""

from __future__ import annotations

import re
import shlex
from typing import Optional

from relax_straggler.monitor.trigger import HANGING
from relax_straggler.monitor.verdict import CONFIRMED

# Kubernetes taint keys and values: at most 63 characters of [A-Za-z0-9._-].
TAINT_KEY = "relax-straggler/straggler"
_TAINT_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]")


def drain_plan(verdict: Optional[dict], job_slowdown: Optional[float], baseline_ms: Optional[float],
               last_ms: Optional[float], last_result: Optional[dict]) -> Optional[dict]:
    """The plan for `verdict` (verdict.current_verdict) when it is `confirmed` or `hanging`,
    else None. job_slowdown: the job's newest step over its baseline median - 1; baseline_ms,
    last_ms: that median and the newest step, ms; last_result: the newest analysis (its
    "whatif" give-back, where an analysis had per-op records). Keys: executed (always
    False), ranks, nodes, node_source, evidence {status, stage, cause, since_step, ratio,
    excess_ms, window}, give_back {whatif, excess_ms_per_step, job_slowdown, step_ms,
    baseline_ms}, commands {slurm, kubernetes} (lists of command lines; None without a
    node), reason (the text the commands carry)."""
    if verdict is None or verdict["status"] not in (CONFIRMED, HANGING):
        return None
    rank, node = verdict["rank"], verdict["node"]
    ratio = verdict.get("ratio")
    what = "hang culprit" if verdict["status"] == HANGING else f"straggler in {verdict['stage']}"
    reason = (f"relax-straggler: job {verdict['job_id']} rank {rank} {what} since step {verdict.get('since_step')}"
              + (f", {ratio:.2f}x its group" if isinstance(ratio, (int, float)) else "")
              + f", cause {verdict['cause']}")
    commands = None
    if node:
        q = shlex.quote(node)
        value = _TAINT_VALUE_BAD.sub("_", verdict["job_id"])[:63]
        commands = {
            "slurm": [f"scontrol update NodeName={q} State=DRAIN Reason={shlex.quote(reason)}"],
            "kubernetes": [f"kubectl cordon {q}",
                           f"kubectl taint nodes {q} {TAINT_KEY}={value}:NoSchedule"],
        }
    whatif = (last_result or {}).get("whatif") if verdict["status"] == CONFIRMED else None
    return {
        "executed": False,
        "ranks": [rank],
        "nodes": [node] if node else [],
        "node_source": verdict.get("node_source"),
        "evidence": {k: verdict.get(k) for k in ("status", "stage", "cause", "since_step", "ratio", "excess_ms",
                                                  "window")},
        "give_back": {"whatif": (whatif or {}).get("give_back") if isinstance(whatif, dict) else None,
                      "excess_ms_per_step": verdict.get("excess_ms"), "job_slowdown": job_slowdown,
                      "step_ms": last_ms, "baseline_ms": baseline_ms},
        "commands": commands,
        "reason": reason,
    }


def plan_text(job_id: str, status: str, plan: Optional[dict]) -> str:
    """The plan as lines for a terminal (what `relax-straggler drain-plan` prints)."""
    if plan is None:
        return (f"job {job_id}: {status}; no drain plan (only a confirmed straggler or a hang's culprit gets one)\n")
    ev, gb = plan["evidence"], plan["give_back"]
    lines = [f"job {job_id}: {status}; drain plan (proposed only: nothing was run)",
             f"  ranks: {', '.join(map(str, plan['ranks']))}",
             f"  nodes: {', '.join(plan['nodes']) or 'unknown'}"
             + (f" (from {plan['node_source']})" if plan["node_source"] else ""),
             f"  evidence: {ev['status']}, stage {ev['stage']}, cause {ev['cause']}, since step {ev['since_step']}"
             + (f", ratio {ev['ratio']:.2f}" if isinstance(ev["ratio"], (int, float)) else "")
             + (f", excess {ev['excess_ms']:.1f} ms/step" if isinstance(ev["excess_ms"], (int, float)) else "")]
    if isinstance(gb["job_slowdown"], (int, float)):
        lines.append(f"  job slowdown now: {100 * gb['job_slowdown']:+.0f} % over its baseline step")
    if gb["whatif"] is not None:
        lines.append(f"  what-if give-back: {gb['whatif']}")
    if plan["commands"] is None:
        lines.append("  no command: the rows name no node and the job registered no ranks_per_node")
    else:
        lines.append("  Slurm:")
        lines += [f"    {c}" for c in plan["commands"]["slurm"]]
        lines.append("  Kubernetes:")
        lines += [f"    {c}" for c in plan["commands"]["kubernetes"]]
    return "\n".join(lines) + "\n"


def plan_from_store(store, job_id: str, topology=None, trigger=None, analyze_config=None) -> dict:
    """The monitor's view of `job_id` read straight from `store` (no monitor running): its
    iterations folded into a detector from the first one, the newest slow window analysed
    as the monitor would (range_analysis), and the plan of the verdict that gives. A job
    that ended is judged on its last window (draining a slow node is worth it after the
    run). Returns {"job_id", "status", "verdict", "drain_plan"}. Raises StoreError,
    InputError, KeyError when the store has no iteration of the job."""
    from relax_straggler.analysis import AnalyzeConfig
    from relax_straggler.common.topology import Topology
    from relax_straggler.monitor.range_analysis import analyze_range
    from relax_straggler.monitor.trigger import ACTIVE, DETECTED, JobDetector, TriggerConfig
    from relax_straggler.monitor.verdict import current_verdict

    iterations = store.iterations(job_id)
    if not iterations:
        raise KeyError(f"the store has no iteration of job {job_id!r}")
    detector = JobDetector(trigger or TriggerConfig(), 0.0)
    window = None
    for it in iterations:
        found = detector.observe([it], it.last_timestamp)
        if found is not None:
            window = found
            detector.analysis_finished()
    if topology is None:
        topology = Topology.flat(max(it.ranks for it in iterations))
    result = None
    if window is not None and detector.detected:
        result = analyze_range(store, job_id, window, 0.0, topology, analyze_config or AnalyzeConfig())
    status = DETECTED if result is not None else ACTIVE
    rank = result["straggler_rank"] if result is not None else None
    verdict = current_verdict(job_id, status, result, None, topology.node_of(rank) if rank is not None else None)
    return {"job_id": job_id, "status": status, "verdict": verdict,
            "drain_plan": drain_plan(verdict, detector.last_growth, detector.median_ms, detector.last_ms, result)}

"""The first line of `analyze`: one status and one sentence derived from every finding the
summary lists under it, so that the headline never contradicts its own evidence.

The sources, each listed under the headline:

- the attribution's anomalies (analysis/findings.py, the base verdict): a worker or link
  -> stragglers; a whole pipeline stage (structural) -> imbalance;
- the confirmed verdict replayed over the steps (analysis/confirmed.py): a confirmed
  straggler -> stragglers; a confirmed imbalance -> imbalance;
- the what-if replay of per-op records (analysis/whatif.py), when the job loses at least
  `min_impact` of its ideal step time (S - 1 >= min_impact, the impact rule of every other
  finding): M_S >= WHATIF_SHARE (fixing the last pipeline stage gives back at least half the
  lost time) -> imbalance; else give_back (M_W) >= WHATIF_SHARE -> stragglers.

Status precedence: stragglers > imbalance > inconclusive > clean. An input the attribution
calls inconclusive (rejected, too few steps, min/max-only) stays inconclusive: its other
sources read the same rows. Otherwise, when nothing is named but the confirmed verdict ended
in `insufficient_evidence` (every rank alone in its group), the headline is inconclusive;
`clean` only when no source names anything.
"""

from __future__ import annotations

from typing import Optional

# The share of the lost time a what-if fix must give back to name its cause: the larger part.
WHATIF_SHARE = 0.5


def headline(base: dict, confirmed: Optional[dict], whatif: Optional[dict], min_impact: float) -> dict:
    """The verdict {"status", "summary"[, "reason"]} of `base` (the attribution's
    verdict_dict) with the confirmed verdict's summary (`summary["confirmed"]`, or None) and
    the what-if figures (`summary["whatif"]`, or None) folded in by the module's rule.
    min_impact: the lost time's share of the ideal step under which the what-if names
    nothing (AnalyzeConfig.min_impact)."""
    if base["status"] == "inconclusive":
        return dict(base)
    status = base["status"]
    parts = [] if status == "clean" else [base["summary"]]
    named = {"stragglers": status == "stragglers", "imbalance": status == "imbalance"}
    if confirmed is not None:
        for c in confirmed.get("stragglers", [])[:1]:
            more = len(confirmed["stragglers"]) - 1
            released = "" if c.get("to_end", True) else f", released after step {c['last_step']}"
            parts.append(f"confirmed straggler rank {c['rank']} in {c['stage']} from step {c['since_step']} "
                         f"({c['ratio']:.2f}x its group, named in {c['steps']} steps{released})"
                         + (f", {more} more (rank, stage) pair(s)" if more else ""))
            named["stragglers"] = True
        for i in confirmed.get("imbalance", [])[:1]:
            parts.append(f"confirmed imbalance: pipeline stage {i['group']} slower in {i['stage']} from step "
                         f"{i['since_step']} ({i['ratio']:.2f}x the fastest stage, named in {i['steps']} steps)")
            named["imbalance"] = True
    lead = _whatif_lead(whatif, min_impact)
    if lead is not None:
        kind, line = lead
        parts.append(line)
        named[kind] = True
    if named["stragglers"]:
        return {"status": "stragglers", "summary": "; ".join(parts)}
    if named["imbalance"]:
        return {"status": "imbalance", "summary": "; ".join(parts)}
    if confirmed is not None and confirmed.get("final_status") == "insufficient_evidence":
        return {"status": "inconclusive", "summary": "no persistent finding, but the confirmed verdict could not "
                                                     "judge the ranks (each alone in its comparison group, or too "
                                                     "few steps): nothing is known to be clean"}
    return dict(base)


def _whatif_lead(whatif: Optional[dict], min_impact: float) -> Optional[tuple[str, str]]:
    """("imbalance" | "stragglers", the line) when the what-if names a cause, else None."""
    if whatif is None or "error" in whatif or whatif.get("slowdown") is None:
        return None
    s = whatif["slowdown"]
    if not s - 1.0 >= min_impact:
        return None
    m_s, m_w, top = whatif.get("m_s"), whatif.get("give_back"), whatif.get("top_worker")
    if m_s is not None and m_s >= WHATIF_SHARE:
        return "imbalance", (f"what-if: the job runs {s:.2f}x slower than without stragglers and fixing the last "
                             f"pipeline stage gives back {m_s * 100:.0f} % of the lost time (M_S)")
    if m_w is not None and m_w >= WHATIF_SHARE and top is not None:
        return "stragglers", (f"what-if: the job runs {s:.2f}x slower than without stragglers and fixing worker "
                              f"dp {top['dp_rank']} / pp {top['stage']} gives back {m_w * 100:.0f} % of the lost time "
                              "(M_W)")
    return None

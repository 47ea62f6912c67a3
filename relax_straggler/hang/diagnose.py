"""Which rank and which collective hold a stopped job: the comparison of per-rank progress
snapshots (docs/DESIGN.md, "When the job stops"). Pure Python, no torch.

A snapshot is what one rank's watchdog published (relax_straggler.hang.watchdog):
{"rank", "step", "wall", "stalled_s", "groups": [{"name", "desc", "ranks", "collective",
"p2p", "completed"}], "analyzer"} with each of the group's last three None or {"seq",
"op", "ago_s"}, and "analyzer" None or {"what", "step", "for_s"}: the training thread
has been inside the analyzer that long (Analyzer.inside).

Within one process group every member numbers its collectives alike, so at a hang:
  lagging    a member whose last collective is older than its peers' never entered the
             one they wait in ("rank 5 never entered all_reduce #1234 of group dp-3").
  missing    a member with no snapshot (stopped, dead, or its watchdog could not write)
             while the others wait in the group's newest collective.
  desync     members at the same sequence number entered different ops.
  analyzer   a rank whose training thread has been inside the analyzer for at least half
             the stop: the stop is the analyzer's own (relax_straggler's fault), not the
             job's; such findings come first, whatever the groups show.
A rank that holds one group may itself wait in another group held by someone else; the
answer names the ranks at the end of such chains first. The ranks that hold one group alike
(the same kind, the same last completed op, all at the end of a chain or none) are one
finding, so the answer stays short and the comparison linear in the ranks however many are
missing; its text names at most TEXT_FINDINGS findings and compact runs of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Optional

from relax_straggler.common.metric_names import HANG_ANSWER, HANG_DETECTED, HANG_KIND, HANG_PREFIX

LAGGING, MISSING, DESYNC, ANALYZER, NONE = "lagging", "missing", "desync", "analyzer", "none"
# How a rank without a snapshot is named, for one rank and for several: the live wording.
PUBLISHED_NOTHING = ("published no progress (stopped, dead or cut off)",) * 2
TEXT_FINDINGS = 10  # findings in the answer's text; the rest are counted
TEXT_RUNS = 16  # runs of ranks in one list of the text; the rest are counted


@dataclass(frozen=True)
class Finding:
    """One group held: kind (LAGGING, MISSING, DESYNC), the holding rank (the first of
    `ranks`; -1 for a desync), the group's label and ranks, the op and sequence number the
    others wait in, how many wait and the least of their waits (s), the holders' last
    completed op (text), the ranks per op for a desync, every rank that holds the group
    alike (default: just `rank`) and how a rank without a snapshot is named (one, several)."""

    kind: str
    rank: int
    group: str
    group_ranks: tuple[int, ...]
    op: str
    seq: int
    waiting: tuple[int, ...]
    waited_s: float
    last_completed: str = ""
    ops_by_rank: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    ranks: tuple[int, ...] = ()
    absent: tuple[str, str] = PUBLISHED_NOTHING

    def __post_init__(self) -> None:
        if not self.ranks and self.rank >= 0:
            object.__setattr__(self, "ranks", (self.rank,))

    def describe(self) -> str:
        """The finding in one sentence (bounded: lists of ranks are cut at TEXT_RUNS runs)."""
        where = f"group {self.group} (ranks {compact(self.group_ranks, TEXT_RUNS)})"
        n = len(self.waiting)
        others = f"the other {'rank has' if n == 1 else f'{n} have'} waited {self.waited_s:.0f} s in it"
        if self.kind == DESYNC:
            ops = "; ".join(f"{op} on ranks {compact(r, TEXT_RUNS)}" for op, r in sorted(self.ops_by_rank.items()))
            return f"desync in {where} at collective #{self.seq}: {ops}"
        several = len(self.ranks) > 1
        who = f"ranks {compact(self.ranks, TEXT_RUNS)}" if several else f"rank {self.rank}"
        if self.kind == ANALYZER:
            return (f"relax_straggler itself has held the training thread of {who} for {self.waited_s:.0f} s "
                    f"({self.op}, step {self.seq}): the analyzer's own stall, not the job's")
        if self.kind == MISSING:
            return f"{who} {self.absent[several]} and never joined {self.op} #{self.seq} of {where}; {others}"
        whose = "their" if several else f"rank {self.rank}'s"
        return (f"{who} never entered {self.op} #{self.seq} of {where}; {others}; {whose} last completed op: "
                f"{self.last_completed or 'none seen'}")


@dataclass(frozen=True)
class HangAnswer:
    """The findings, root causes first (holders not themselves waiting in another held
    group), the ranks without a snapshot and the analysed step (the newest step ended)."""

    findings: tuple[Finding, ...]
    no_snapshot: tuple[int, ...]
    step: int
    stalled_s: float

    @property
    def kind(self) -> str:
        return self.findings[0].kind if self.findings else NONE

    def text(self) -> str:
        """One paragraph for an operator: the first TEXT_FINDINGS findings, then how many more."""
        if not self.findings:
            seen = f"; no snapshot from ranks {compact(self.no_snapshot, TEXT_RUNS)}" if self.no_snapshot else ""
            return (f"no step ended for {self.stalled_s:.0f} s after step {self.step}, but no rank is behind its "
                    f"peers in any timed process group (a stop outside collectives, or every rank waits in the "
                    f"same one){seen}")
        text = "; ".join(f.describe() for f in self.findings[:TEXT_FINDINGS])
        more = len(self.findings) - TEXT_FINDINGS
        return text + (f"; and {more} more finding{'s' if more > 1 else ''}" if more > 0 else "")

    def metrics(self) -> dict[str, Any]:
        """straggler/hang/* (docs/METRICS.md): the first finding's fields and the answer text."""
        f = self.findings[0] if self.findings else None
        return {
            HANG_DETECTED: 1,
            HANG_KIND: self.kind,
            HANG_PREFIX + "rank": f.rank if f else -1,
            HANG_PREFIX + "group": f.group if f else "",
            HANG_PREFIX + "group_ranks": compact(f.group_ranks) if f else "",
            HANG_PREFIX + "op": f.op if f else "",
            HANG_PREFIX + "seq": f.seq if f else -1,
            HANG_PREFIX + "waiting_ranks": len(f.waiting) if f else 0,
            HANG_PREFIX + "waited_s": f.waited_s if f else 0.0,
            HANG_PREFIX + "last_completed": f.last_completed if f else "",
            HANG_PREFIX + "no_snapshot_ranks": compact(self.no_snapshot),
            HANG_PREFIX + "stalled_s": self.stalled_s,
            HANG_PREFIX + "step": self.step,
            HANG_ANSWER: self.text(),
        }


def compact(ranks: Iterable[int], runs: Optional[int] = None) -> str:
    """"4-7", "0,2,5-6": sorted ranks with runs collapsed ("" for none). runs: show at most
    this many runs, then ",... (N ranks in all)"."""
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        if runs is not None and len(parts) == runs:
            parts.append(f"... ({len(rs)} ranks in all)")
            break
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


def label(group: Mapping[str, Any]) -> str:
    """A group's name for people: its description when torch has one, else its c10d name."""
    desc = group.get("desc") or ""
    return desc if desc and desc != "undefined" else str(group["name"])


def diagnose(snapshots: Mapping[int, Mapping[str, Any]], ranks: Iterable[int],
             now: Optional[float] = None, absent: tuple[str, str] = PUBLISHED_NOTHING) -> HangAnswer:
    """Compares the snapshots of `ranks` (global ranks; missing keys: no snapshot) and
    returns the answer; time linear in the ranks and the snapshots' groups. now: the wall
    time (s) of the answer; waits then count up to it from each snapshot's "wall" (default:
    as of each snapshot). absent: how a rank without a snapshot is named (one rank,
    several). Raises KeyError / TypeError on a snapshot without the fields above."""
    expected = sorted(set(ranks))
    no_snapshot = tuple(r for r in expected if r not in snapshots)
    absent_ranks = frozenset(no_snapshot)
    groups: dict[str, dict[str, Any]] = {}  # name -> {"label", "ranks", "by_rank": {rank: group entry}}
    for rank, snap in snapshots.items():
        for g in snap["groups"]:
            if g["name"] not in groups:  # the ranks once per group, not once per member
                groups[g["name"]] = {"label": label(g), "ranks": tuple(g["ranks"]), "by_rank": {}}
            groups[g["name"]]["by_rank"][rank] = g
    current = {rank: _current_group(snap) for rank, snap in snapshots.items()}
    per_group: list[list[Finding]] = []
    waiting_somewhere: set[int] = set()
    passed: dict[tuple[int, str], int] = {}  # (rank, group): its last collective there, which every peer passed
    aged = {r: max(now - float(s["wall"]), 0.0) if now is not None else 0.0 for r, s in snapshots.items()}
    for name, info in sorted(groups.items()):
        found = _group_findings(name, info, absent_ranks, current, passed, aged, absent)
        if found:
            per_group.append(found)
            waiting_somewhere.update(found[0].waiting)
    findings = [c for found in per_group
                for c in _collapse([_with_last_completed(f, snapshots, groups, passed) for f in found],
                                   waiting_somewhere)]
    step = max((int(s["step"]) for s in snapshots.values()), default=-1)
    stalled = max((float(s["stalled_s"]) for s in snapshots.values()), default=0.0)
    ours = _analyzer_findings(snapshots)
    return HangAnswer(tuple(ours + _roots_first(findings, waiting_somewhere)), no_snapshot, step, stalled)


def _analyzer_findings(snapshots: Mapping[int, Mapping[str, Any]]) -> list[Finding]:
    """One finding per rank whose training thread has been inside the analyzer for at least
    half its stop, longest first."""
    out = []
    for rank, snap in snapshots.items():
        inside = snap.get("analyzer")
        if inside and 2 * float(inside["for_s"]) >= float(snap["stalled_s"]):
            out.append(Finding(kind=ANALYZER, rank=rank, group="", group_ranks=(), op=str(inside["what"]),
                               seq=int(inside["step"]), waiting=(), waited_s=float(inside["for_s"])))
    return sorted(out, key=lambda f: (-f.waited_s, f.rank))


def _current_group(snap: Mapping[str, Any]) -> Optional[str]:
    """The group of the collective this rank entered last (where a blocked rank blocks), or
    None when its last op was a send / recv or it entered none."""
    best: Optional[tuple[float, Optional[str]]] = None
    for g in snap["groups"]:
        for kind in ("collective", "p2p"):
            e = g[kind]
            if e and (best is None or e["ago_s"] < best[0]):
                best = (e["ago_s"], g["name"] if kind == "collective" else None)
    return best[1] if best else None


def _group_findings(name: str, info: dict[str, Any], absent_ranks: frozenset[int],
                    current: dict[int, Optional[str]], passed: dict[tuple[int, str], int], aged: dict[int, float],
                    absent: tuple[str, str]) -> list[Finding]:
    """One finding per holding rank of group `name` (and one desync), all sharing one
    `waiting` tuple; [] when the group holds nobody."""
    by_rank = info["by_rank"]
    seq = {r: (g["collective"] or {}).get("seq", 0) for r, g in by_rank.items()}
    top = max(seq.values(), default=0)
    if top == 0:
        return []
    at_top = sorted(r for r, s in seq.items() if s == top)
    behind = sorted(r for r, s in seq.items() if s < top)
    for r in behind:
        passed[(r, name)] = seq[r]
    # Members at the newest collective that have entered nothing since: they wait in it.
    waiting = tuple(r for r in at_top if current.get(r) == name)
    if not waiting:
        return []  # everyone here went on to other work: this group holds nobody
    ops: dict[str, list[int]] = {}
    for r in at_top:
        ops.setdefault(by_rank[r]["collective"]["op"], []).append(r)
    waited = min(by_rank[r]["collective"]["ago_s"] + aged[r] for r in waiting)
    base = dict(group=info["label"], group_ranks=info["ranks"], seq=top, waiting=waiting, waited_s=waited,
                absent=absent)
    out = []
    if len(ops) > 1:
        out.append(Finding(kind=DESYNC, rank=-1, op="/".join(sorted(ops)), **base,
                           ops_by_rank={op: tuple(rs) for op, rs in ops.items()}))
    op = max(sorted(ops), key=lambda o: len(ops[o]))  # the op most members entered
    out += [Finding(kind=LAGGING, rank=r, op=op, **base) for r in behind]
    out += [Finding(kind=MISSING, rank=r, op=op, **base) for r in info["ranks"] if r in absent_ranks]
    return out


def _with_last_completed(f: Finding, snapshots: Mapping[int, Mapping[str, Any]], groups: dict[str, dict[str, Any]],
                         passed: dict[tuple[int, str], int]) -> Finding:
    """The holder's most recent completed op over its groups: seen completed by its own
    wrapper, or a collective its peers have passed."""
    if f.kind != LAGGING:
        return f
    best: Optional[tuple[float, str]] = None
    for g in snapshots[f.rank]["groups"]:
        where = f"of group {groups[g['name']]['label']}"
        candidates = []
        if g["completed"]:
            c = g["completed"]
            candidates.append((c["ago_s"], f"{c['op']} #{c['seq']} {where}"))
        e = g["collective"]
        if e and passed.get((f.rank, g["name"])) == e["seq"]:
            candidates.append((e["ago_s"], f"{e['op']} #{e['seq']} {where}"))
        for c in candidates:
            if best is None or c[0] < best[0]:
                best = c
    return f if best is None else replace(f, last_completed=best[1])


def _collapse(found: list[Finding], waiting_somewhere: set[int]) -> list[Finding]:
    """The findings of one group, those of one kind whose holders are alike (the same last
    completed op, all waiting in another held group or none) merged into one over their
    ranks, in the order of their first rank."""
    merged: dict[tuple[str, bool, str], list[Finding]] = {}
    for f in found:
        merged.setdefault((f.kind, f.rank in waiting_somewhere, f.last_completed), []).append(f)
    out = []
    for fs in merged.values():
        ranks = tuple(sorted(f.rank for f in fs))
        out.append(fs[0] if len(fs) == 1 else replace(fs[0], rank=ranks[0], ranks=ranks))
    return out


def _roots_first(findings: list[Finding], waiting_somewhere: set[int]) -> list[Finding]:
    """Findings whose holder does not itself wait in another held group first, then by the
    longest wait; a desync ranks with the roots."""
    return sorted(findings, key=lambda f: (f.rank in waiting_somewhere and f.kind != DESYNC, -f.waited_s, f.rank))

"""The hang answer from PyTorch Flight Recorder dumps: each rank's recorded ops become the
progress snapshot its watchdog would have published, and the same diagnose() compares them
(docs/ANALYZE.md, "Flight Recorder dumps").

Per rank and process group the snapshot holds the newest collective entered (by
collective_seq_id), the newest send / recv (by p2p_seq_id) and the newest op seen done
(completed, or retired), each aged from the rank's dump time: the file's modification
time, or the rank's newest recorded time when that is later. A rank with no dump is
missing.

A group's ranks come from the dump's pg_config (a rank that recorded ops in a group whose
pg_config leaves it out makes the dumps inconsistent: refused); the default group holds
every expected rank; a group the dumps name no ranks for (Gloo writes none) holds the ranks
that recorded an op in it. A member that recorded nothing in a group is compared as having
entered none of its collectives only when that is certain: its ring buffer never wrapped
(its first record is kept), or its pg_status, which keeps every group it ever recorded in,
lacks the group. The expected ranks are world_size when given, else 0 .. the highest rank
any dump or pg_config names, Gloo's placeholder group "" included when every dump that has
it gives it the same ranks (it lists the whole world, so a dead last rank is seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from relax_straggler.common.metric_names import HANG_ANSWER
from relax_straggler.hang.diagnose import TEXT_RUNS, HangAnswer, compact, diagnose, label
from relax_straggler.hang.fr_dumps import Dump, Entry, dump_files, load_dump
from relax_straggler.hang.slow_collectives import slow_collectives
from relax_straggler.readers.base import InputError

FORMAT = "flight-recorder"

# Where a group's ranks came from, as the summary names it.
FROM_CONFIG, FROM_WORLD, FROM_RECORDS = "pg_config", "default group", "recorded ops"
NO_DUMP = ("has no dump", "have no dump")  # a rank without a dump, for diagnose (one, several)


@dataclass(frozen=True)
class Group:
    """A process group of the dumps: its c10d name, torch description, global ranks and
    where those came from (FROM_CONFIG, FROM_WORLD or FROM_RECORDS)."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    ranks_from: str


@dataclass(frozen=True)
class FlightRecorderAnswer:
    """The dumps read from `path`, the expected ranks, the groups, the hang answer and the
    slow-collective evidence (None when no dump has durations)."""

    path: str
    dumps: dict[int, Dump]
    expected: tuple[int, ...]
    groups: tuple[Group, ...]
    answer: HangAnswer
    slow: Optional[dict[str, Any]]

    def text(self) -> str:
        """The answer in words; with no finding, what the dumps do show."""
        if self.answer.findings:
            return self.answer.text()
        missing = (f"; no dump from ranks {compact(self.answer.no_snapshot, TEXT_RUNS)}"
                   if self.answer.no_snapshot else "")
        return ("no rank is behind its peers in any process group of the dumps (every rank waits in the same "
                f"collective, or the stop is outside collectives){missing}")

    def metrics(self) -> dict[str, Any]:
        """straggler/hang/* (docs/METRICS.md); step is -1 (a dump records no training step)."""
        return {**self.answer.metrics(), HANG_ANSWER: self.text()}

    def summary(self) -> dict[str, Any]:
        """The JSON summary of `relax-straggler analyze` for this input (docs/ANALYZE.md)."""
        dumps = self.dumps.values()
        return {
            "input": {
                "path": self.path, "format": FORMAT, "dumps": len(self.dumps), "ranks": compact(self.dumps),
                "expected_ranks": compact(self.expected), "no_dump_ranks": compact(self.answer.no_snapshot),
                "versions": sorted({d.version for d in dumps}),
                "comm_lib_versions": sorted({d.lib_version for d in dumps if d.lib_version}),
                "entries": sum(len(d.entries) for d in dumps),
                "wrapped_ranks": compact(d.rank for d in dumps if d.wrapped and d.entries),
                "groups": [{"group": label({"name": g.name, "desc": g.desc}), "name": g.name,
                            "ranks": compact(g.ranks), "ranks_from": g.ranks_from} for g in self.groups],
            },
            "hang": self.metrics(),
            "findings": [{"kind": f.kind, "rank": f.rank, "ranks": compact(f.ranks), "group": f.group,
                          "group_ranks": compact(f.group_ranks),
                          "op": f.op, "seq": f.seq, "waiting_ranks": compact(f.waiting), "waited_s": f.waited_s,
                          "last_completed": f.last_completed,
                          "ops_by_rank": {op: compact(r) for op, r in sorted(f.ops_by_rank.items())},
                          "text": f.describe()} for f in self.answer.findings],
            "slow_collectives": self.slow,
        }


def read_flight_recorder(path: str, world_size: Optional[int] = None) -> FlightRecorderAnswer:
    """Reads the dumps at `path` (a directory, a glob or one file; fr_dumps.dump_files) and
    answers. world_size: the job's ranks (default: inferred, see the module docstring).
    Raises InputError for unreadable or inconsistent dumps, or dumps without any op;
    OSError for a file that cannot be opened."""
    dumps = {rank: load_dump(f, rank) for rank, f in sorted(dump_files(path).items())}
    if not any(d.entries for d in dumps.values()):
        raise InputError(f"{path}: the dumps record no op (a Flight Recorder buffer of size 0, "
                         f"or dumped with onlyActive and nothing in flight)")
    expected = _expected_ranks(dumps, world_size)
    groups = _groups(dumps, expected)
    pg_ids = _pg_ids(dumps)
    members = {name: frozenset(g.ranks) for name, g in groups.items()}
    snapshots = {rank: _snapshot(d, groups, members, pg_ids) for rank, d in dumps.items()}
    return FlightRecorderAnswer(path=path, dumps=dumps, expected=expected, groups=tuple(groups.values()),
                                answer=diagnose(snapshots, expected, absent=NO_DUMP), slow=slow_collectives(dumps))


def _expected_ranks(dumps: dict[int, Dump], world_size: Optional[int]) -> tuple[int, ...]:
    # Gloo's placeholder group "" is no group the ranks record ops in, but it lists the world:
    # trusted when the dumps that have it agree on it.
    named = set(dumps) | {r for d in dumps.values() for name, (_, ranks) in d.groups.items() if name
                          for r in ranks or ()}
    worlds = {d.groups[""][1] for d in dumps.values() if "" in d.groups}
    if len(worlds) == 1:
        named.update(next(iter(worlds)) or ())
    if world_size is not None:
        outside = sorted(r for r in named if r >= world_size)
        if outside:
            where = dumps[outside[0]].path if outside[0] in dumps else "pg_config"
            raise InputError(f"{where}: rank {outside[0]} is outside the world size {world_size}")
        return tuple(range(world_size))
    return tuple(range(max(named) + 1))


def _is_default(name: str, desc: str) -> bool:
    return desc == "default_pg" or (name == "0" and desc in ("", "undefined"))


def _groups(dumps: dict[int, Dump], expected: tuple[int, ...]) -> dict[str, Group]:
    """Every group the dumps record an op in, with its members."""
    recorded: dict[str, tuple[str, set[int]]] = {}
    for d in dumps.values():
        for e in d.entries:
            recorded.setdefault(e.group, (e.desc, set()))[1].add(d.rank)
    configured: dict[str, tuple[str, tuple[int, ...], str]] = {}  # name -> (desc, ranks, file)
    for d in dumps.values():
        for name, (desc, ranks) in d.groups.items():
            if ranks is None or name not in recorded:
                continue
            seen = configured.setdefault(name, (desc, ranks, d.path))
            if seen[1] != ranks:
                raise InputError(f"{d.path}: pg_config gives group {name!r} ranks {compact(ranks)}, "
                                 f"{seen[2]} gives {compact(seen[1])}")
    for name, (desc, ranks, where) in configured.items():
        outside = sorted(recorded[name][1].difference(ranks))
        if outside:
            raise InputError(f"{dumps[outside[0]].path}: rank {outside[0]} recorded ops in group {name!r} ({desc}), "
                             f"whose pg_config in {where} holds ranks {compact(ranks, TEXT_RUNS)}; the dumps do not "
                             f"describe one job")
    out = {}
    for name, (desc, ranks) in sorted(recorded.items()):
        if name in configured:
            out[name] = Group(name, desc, configured[name][1], FROM_CONFIG)
        elif _is_default(name, desc):
            out[name] = Group(name, desc, expected, FROM_WORLD)
        else:
            out[name] = Group(name, desc, tuple(sorted(ranks)), FROM_RECORDS)
    return out


def _pg_ids(dumps: dict[int, Dump]) -> dict[str, int]:
    """group name -> its pg_id (the pg_status key), from the entries of every dump."""
    return {e.group: e.pg_id for d in dumps.values() for e in d.entries if e.pg_id is not None}


def _never_recorded(d: Dump, group: str, pg_ids: dict[str, int]) -> bool:
    """Whether rank d.rank certainly recorded no op in `group` (not merely lost it from the ring)."""
    if not d.wrapped:
        return True
    return d.pg_ids is not None and group in pg_ids and pg_ids[group] not in d.pg_ids


def _snapshot(d: Dump, groups: dict[str, Group], members: dict[str, frozenset[int]],
              pg_ids: dict[str, int]) -> dict[str, Any]:
    """The watchdog snapshot (relax_straggler.hang.diagnose) of one rank's dump; members:
    each group's ranks as a set. The groups' rank tuples are shared, not copied."""
    times = [t for e in d.entries for t in (e.created_ns, e.started_ns, e.completed_ns) if t is not None]
    newest = max(times, default=0) / 1e9
    wall = max(d.mtime, newest)
    newest_created = max((e.created_ns for e in d.entries), default=0) / 1e9

    def at(e: Optional[Entry], ns: Optional[int] = None) -> Optional[dict[str, Any]]:
        if e is None:
            return None
        return {"seq": e.seq, "op": e.op, "ago_s": max(wall - (ns or e.created_ns) / 1e9, 0.0)}

    by_group: dict[str, list[Entry]] = {}
    for e in d.entries:
        by_group.setdefault(e.group, []).append(e)
    out = []
    for name, g in groups.items():
        es = by_group.get(name, [])
        if not es and not (d.rank in members[name] and _never_recorded(d, name, pg_ids)):
            continue
        coll = max((e for e in es if not e.is_p2p), key=lambda e: (e.seq, e.record_id), default=None)
        p2p = max((e for e in es if e.is_p2p), key=lambda e: (e.seq, e.record_id), default=None)
        done = max((e for e in es if e.done), key=lambda e: (e.completed_ns or e.created_ns, e.record_id),
                   default=None)
        out.append({"name": name, "desc": g.desc, "ranks": g.ranks, "collective": at(coll), "p2p": at(p2p),
                    "completed": at(done, done.completed_ns if done else None)})
    stalled = max(wall - newest_created, 0.0) if d.entries else 0.0
    return {"rank": d.rank, "step": -1, "wall": wall, "stalled_s": stalled, "groups": out}

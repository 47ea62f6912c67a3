"""Shared by the per-operation trace readers (parquet and Chrome trace): job metadata
beside the trace, op-name resolution with reporting, and the accumulator that sums
per-operation durations into per-step StepTimes.

Memory is O(steps x ranks x columns) for the sums, plus 8 bytes per row for duplicate
detection; rows themselves are never kept.
"""

from __future__ import annotations

import os
import re
from typing import Iterator, Optional

import numpy as np
import yaml

from relax_straggler.readers.base import P2P_OPS, InputError, Problems, StepTimes, check_dense
from relax_straggler.topology import Topology, make_layout
from relax_straggler.readers.megatron_names import TimerTarget, timer_target
from relax_straggler.stages import STAGES

_TRACE_NAME = re.compile(r"^(?:trace|timeline|ideal-timeline)-(?P<name>.+?)\.(?:parquet|json|json\.gz)$")


def meta_path_for(trace_path: str) -> Optional[str]:
    """meta-NAME.yaml beside trace-NAME.parquet / timeline-NAME.json.gz, if it exists."""
    m = _TRACE_NAME.match(os.path.basename(trace_path))
    if not m:
        return None
    candidate = os.path.join(os.path.dirname(trace_path), f"meta-{m.group('name')}.yaml")
    return candidate if os.path.exists(candidate) else None


def load_meta(path: str) -> Topology:
    """Topology from a what-if meta file: dp_size, pp_size, tp_size, and optionally
    dsp_size (or cp_size: context / sequence-data parallel), vpp_size (model chunks per
    stage) and world_size (must be dp x pp x tp x dsp). Raises InputError naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            meta = yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read job metadata: {exc}") from None
    if not isinstance(meta, dict):
        raise InputError(f"{path}: job metadata must be a mapping, got {type(meta).__name__}")
    if "dsp_size" in meta and "cp_size" in meta and meta["dsp_size"] != meta["cp_size"]:
        raise InputError(f"{path}: dsp_size {meta['dsp_size']} and cp_size {meta['cp_size']} disagree")
    try:
        sizes = {k: int(meta[k]) for k in ("dp_size", "pp_size", "tp_size")}
        cp = int(meta.get("dsp_size", meta.get("cp_size", 1)))
        topology = make_layout(sizes["dp_size"], sizes["pp_size"], sizes["tp_size"], cp=cp,
                               vpp=int(meta.get("vpp_size", 1)))
        world = int(meta.get("world_size", topology.dp * topology.pp * topology.slots))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: job metadata needs integer dp_size, pp_size, tp_size (and dsp_size, vpp_size "
                         f">= 1, world_size when given): {exc}") from None
    if world != topology.dp * topology.pp * topology.slots:
        raise InputError(f"{path}: world_size {meta['world_size']} != dp x pp x tp x dsp = "
                         f"{topology.dp * topology.pp * topology.slots}")
    return topology


class OpNames:
    """Resolves op names to TimerTargets, reporting each unknown name once (with the
    first line or row it appeared on) and counting every row."""

    def __init__(self, problems: Problems) -> None:
        self._problems = problems
        self._cache: dict[str, Optional[TimerTarget]] = {}
        self.excluded: dict[str, int] = {}
        self.unknown: dict[str, int] = {}

    def known(self, name: str) -> bool:
        """Whether a name already resolved is a Megatron timer name (excluded ones included)."""
        return self._cache.get(name) is not None

    def resolve(self, name: str, line: int, rows: int = 1) -> Optional[TimerTarget]:
        """The target, or None for an excluded or unknown name (counted)."""
        if name not in self._cache:
            self._cache[name] = timer_target(name)
            if self._cache[name] is None:
                self._problems.report(line, f"unknown op name {name!r} (not a Megatron timer name; "
                                            "see docs/ANALYZE.md for the mapping)", kind="unknown_op", skipped=0)
        target = self._cache[name]
        if target is None:
            self.unknown[name] = self.unknown.get(name, 0) + rows
            return None
        if target.stage is None:
            self.excluded[name] = self.excluded.get(name, 0) + rows
            return None
        return target


class DuplicateFilter:
    """Remembers packed int64 row keys; returns which keys were seen before. Sorted parts
    merged like a binary counter, so n keys cost O(n log n) over the whole file."""

    def __init__(self) -> None:
        self._parts: list[np.ndarray] = []

    def seen_before(self, keys: np.ndarray) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        # Found in sorted order (searchsorted of sorted needles walks the part once).
        dup_sorted = np.zeros(keys.shape, dtype=bool)
        dup_sorted[1:] = sorted_keys[1:] == sorted_keys[:-1]
        for part in self._parts:
            idx = np.searchsorted(part, sorted_keys)
            idx[idx == part.size] = 0
            dup_sorted |= part[idx] == sorted_keys
        dup = np.empty(keys.shape, dtype=bool)
        dup[order] = dup_sorted
        # Sorted and unique; parts are disjoint, so a merge is a sort of the two
        # (np.unique / union1d would hash again and import numpy.ma).
        fresh = sorted_keys[~dup_sorted]
        if fresh.size == 0:
            return dup
        self._parts.append(fresh)
        while len(self._parts) > 1 and self._parts[-1].size >= self._parts[-2].size:
            merged = np.concatenate((self._parts.pop(), self._parts.pop()))
            merged.sort()
            self._parts.append(merged)
        return dup


class StepAccumulator:
    """Sums op durations (ms) per (step, rank, stage column) and per p2p column, and tracks
    each step's wall span from op start/end times (ms). The sums are dense, so they may
    grow only within the budget of the rows added (readers/base.py check_dense); path
    names the input in that refusal."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._rows = 0
        self._steps: dict[int, int] = {}
        self._ranks: dict[int, int] = {}
        self._ms = np.zeros((0, 0, len(STAGES)))
        self._ran = np.zeros((0, 0, len(STAGES)), dtype=bool)
        self._p2p = np.zeros((0, 0, len(P2P_OPS)))
        self._p2p_ran = np.zeros((0, 0, len(P2P_OPS)), dtype=bool)
        self._start = np.zeros(0)
        self._end = np.zeros(0)
        self.any_p2p = False

    def _index(self, table: dict[int, int], values: np.ndarray) -> np.ndarray:
        uniq, inverse = np.unique(values, return_inverse=True)
        for v in uniq.tolist():
            table.setdefault(int(v), len(table))
        lookup = np.array([table[int(v)] for v in uniq.tolist()], dtype=np.int64)
        return lookup[inverse]

    def _grow(self) -> None:
        s, r = len(self._steps), len(self._ranks)
        if s <= self._ms.shape[0] and r <= self._ms.shape[1]:
            return
        check_dense(self._path, s, r, self._rows, "distinct step and rank ids")
        S, R = max(s, 2 * self._ms.shape[0]), max(r, self._ms.shape[1])

        def grown(a: np.ndarray, fill) -> np.ndarray:
            out = np.full((S, R) + a.shape[2:], fill, dtype=a.dtype)
            out[: a.shape[0], : a.shape[1]] = a
            return out

        self._ms, self._ran = grown(self._ms, 0.0), grown(self._ran, False)
        self._p2p, self._p2p_ran = grown(self._p2p, 0.0), grown(self._p2p_ran, False)
        start, end = np.full(S, np.inf), np.full(S, -np.inf)
        start[: self._start.size], end[: self._end.size] = self._start, self._end
        self._start, self._end = start, end

    def add(self, steps: np.ndarray, ranks: np.ndarray, stage: np.ndarray, p2p: np.ndarray,
            duration_ms: np.ndarray, start_ms: Optional[np.ndarray]) -> None:
        """One batch of valid rows: stage (rows,) STAGES column; p2p (rows,) P2P_OPS
        column or -1; start_ms (rows,) op start or None when the input has no start times."""
        if steps.size == 0:
            return
        self._rows += steps.size
        si = self._index(self._steps, steps)
        ri = self._index(self._ranks, ranks)
        self._grow()
        np.add.at(self._ms, (si, ri, stage), duration_ms)
        self._ran[si, ri, stage] = True
        has = p2p >= 0
        if has.any():
            self.any_p2p = True
            np.add.at(self._p2p, (si[has], ri[has], p2p[has]), duration_ms[has])
            self._p2p_ran[si[has], ri[has], p2p[has]] = True
        if start_ms is not None:
            np.minimum.at(self._start, si, start_ms)
            np.maximum.at(self._end, si, start_ms + duration_ms)

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def keys(self) -> list[int]:
        """The rank keys added so far."""
        return sorted(self._ranks)

    def steps(self, remap: Optional[dict[int, int]] = None) -> Iterator[StepTimes]:
        """StepTimes in ascending step order, every step over the union of ranks.
        remap: rank key -> rank, merging keys that map to one rank (sums add up); keys
        absent from it are left out. Raises InputError when no valid row was added."""
        if not self._steps:
            raise InputError(f"{self._path}: no usable operation rows")
        remap = remap if remap is not None else {k: k for k in self._ranks}
        ranks = np.array(sorted(set(remap.values())), dtype=np.int64)
        row_of = {int(r): i for i, r in enumerate(ranks.tolist())}
        src = np.array([self._ranks[k] for k in remap], dtype=np.int64)
        dst = np.array([row_of[remap[k]] for k in remap], dtype=np.int64)
        for step in sorted(self._steps):
            i = self._steps[step]
            ms, ran = self._merge(self._ms[i], self._ran[i], src, dst, ranks.size)
            p2p = None
            if self.any_p2p:
                p2p_ms, p2p_ran = self._merge(self._p2p[i], self._p2p_ran[i], src, dst, ranks.size)
                p2p = np.where(p2p_ran, p2p_ms, np.nan)
            span = self._end[i] - self._start[i] if np.isfinite(self._start[i]) else np.nan
            yield StepTimes(step=step, ranks=ranks, ms=np.where(ran, ms, np.nan), p2p_ms=p2p, step_ms=float(span))

    @staticmethod
    def _merge(values: np.ndarray, ran: np.ndarray, src: np.ndarray, dst: np.ndarray, rows: int):
        out = np.zeros((rows, values.shape[1]))
        out_ran = np.zeros((rows, values.shape[1]), dtype=bool)
        np.add.at(out, dst, values[src])
        np.logical_or.at(out_ran, dst, ran[src])
        return out, out_ran


def row_keys(*columns: np.ndarray) -> np.ndarray:
    """A 64-bit hash per row of int64 columns (SplitMix64 finalizer chained over the
    columns); equal rows give equal keys, different rows collide with probability ~2^-64."""
    with np.errstate(over="ignore"):
        h = np.zeros(columns[0].shape, dtype=np.uint64)
        for col in columns:
            x = h ^ (col.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15))
            x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = x ^ (x >> np.uint64(31))
    return h.view(np.int64)

"""Shared by the per-operation trace readers (parquet and Chrome trace): job metadata
beside the trace, op-name resolution with reporting, and the accumulator that sums
per-operation durations into per-step StepTimes.

Memory is O(cells with a row) for the sums (StepAccumulator, 16 bytes a (step, rank,
column) cell), plus 8 bytes per row for duplicate detection; rows themselves are never
kept, and one step at a time is made dense.
"""

from __future__ import annotations

import os
import re
from typing import Iterator, Optional

import numpy as np
import yaml

from relax_straggler.common.stages import STAGES
from relax_straggler.common.topology import Topology, make_layout
from relax_straggler.readers.base import P2P_OPS, InputError, Problems, StepTimes, check_dense
from relax_straggler.readers.megatron_names import TimerTarget, timer_target

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
    """Sums op durations (ms) per (step, rank, column) — the STAGES columns, then the
    P2P_OPS ones — and tracks each step's wall span from op start/end times (ms).

    The sums are sparse, one (packed key, ms) pair per cell that has a row: a batch's cells
    are summed in row order and kept as a sorted part, and parts are merged like a binary
    counter (a cell takes part in O(log rows) merges), so memory is O(cells with a row) <=
    O(rows) in any row order (ranks first, steps first or shuffled); steps() builds one
    dense step at a time, O(ranks x columns). The steps x ranks the analysis will expand
    the input to are bounded by the rows added (readers/base.py check_dense); path names
    the input in that refusal."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._rows = 0
        self._steps = KeyIndex()
        self._ranks = KeyIndex()
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []  # (sorted unique keys, ms), largest first
        self._start = np.zeros(0)
        self._end = np.zeros(0)
        self.any_p2p = False

    def add(self, steps: np.ndarray, ranks: np.ndarray, stage: np.ndarray, p2p: np.ndarray,
            duration_ms: np.ndarray, start_ms: Optional[np.ndarray]) -> None:
        """One batch of valid rows: stage (rows,) STAGES column; p2p (rows,) P2P_OPS
        column or -1; start_ms (rows,) op start or None when the input has no start times.
        Raises InputError when the distinct steps x ranks exceed the rows' budget."""
        if steps.size == 0:
            return
        self._rows += steps.size
        si = self._steps.add(steps)
        ri = self._ranks.add(ranks)
        check_dense(self._path, len(self._steps), len(self._ranks), self._rows, "distinct step and rank ids")
        if len(self._ranks) > _RANK_MASK or len(self._steps) > _STEP_LIMIT:
            raise InputError(f"{self._path}: {len(self._steps):,} distinct steps and {len(self._ranks):,} distinct "
                             "rank ids: more than a trace can hold")
        has = p2p >= 0
        self.any_p2p |= bool(has.any())
        cell = (si << _STEP_SHIFT) | (ri << _COLUMN_BITS)
        keys = np.concatenate((cell | stage, cell[has] | (len(STAGES) + p2p[has])))
        self._push(*_summed(keys, np.concatenate((duration_ms, duration_ms[has]))))
        if start_ms is not None:
            if self._start.size < len(self._steps):
                grown = max(len(self._steps), 2 * self._start.size)
                self._start = np.concatenate((self._start, np.full(grown - self._start.size, np.inf)))
                self._end = np.concatenate((self._end, np.full(grown - self._end.size, -np.inf)))
            np.minimum.at(self._start, si, start_ms)
            np.maximum.at(self._end, si, start_ms + duration_ms)

    def _push(self, keys: np.ndarray, ms: np.ndarray) -> None:
        """Adds a sorted part; merges the newest parts while the newest is the larger."""
        self._parts.append((keys, ms))
        while len(self._parts) > 1 and self._parts[-1][0].size >= self._parts[-2][0].size:
            self._merge_newest()

    def _merge_newest(self) -> None:
        """The two newest parts as one, the earlier's sums first."""
        later, earlier = self._parts.pop(), self._parts.pop()
        self._parts.append(_summed(np.concatenate((earlier[0], later[0])), np.concatenate((earlier[1], later[1]))))

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def keys(self) -> np.ndarray:
        """The rank keys added so far, ascending."""
        return self._ranks.sorted_keys()

    def steps(self, keys: Optional[np.ndarray] = None, ranks: Optional[np.ndarray] = None) -> Iterator[StepTimes]:
        """StepTimes in ascending step order, every step over the union of ranks.
        keys, ranks: (n,) rank keys and the rank of each, merging keys that map to one rank
        (sums add up); keys absent from them are left out; None: every key is its rank.
        Raises InputError when no valid row was added."""
        if not len(self._steps):
            raise InputError(f"{self._path}: no usable operation rows")
        if keys is None:
            keys = ranks = self._ranks.sorted_keys()
        out_ranks, rows = np.unique(ranks, return_inverse=True)
        merged = out_ranks.size < rows.size
        dst = np.full(len(self._ranks), -1, dtype=np.int64)  # rank index -> output row, -1: left out
        dst[self._ranks.find(keys)] = rows
        while len(self._parts) > 1:  # one sorted part: each step is one slice of it
            self._merge_newest()
        cells, ms = self._parts[0]
        width = len(STAGES) + len(P2P_OPS)
        steps = self._steps.sorted_keys()
        for step, i in zip(steps.tolist(), self._steps.find(steps).tolist()):
            lo, hi = np.searchsorted(cells, [i << _STEP_SHIFT, (i + 1) << _STEP_SHIFT])
            row = dst[(cells[lo:hi] >> _COLUMN_BITS) & _RANK_MASK]
            col = cells[lo:hi] & _COLUMN_MASK
            kept = row >= 0
            values = np.full((out_ranks.size, width), np.nan)
            if merged:  # several keys (lanes) of one rank: their cells add up
                ran = np.zeros(values.shape, dtype=bool)
                ran[row[kept], col[kept]] = True
                values[ran] = 0.0
                np.add.at(values, (row[kept], col[kept]), ms[lo:hi][kept])
            else:
                values[row[kept], col[kept]] = ms[lo:hi][kept]
            span = self._end[i] - self._start[i] if i < self._start.size and np.isfinite(self._start[i]) else np.nan
            yield StepTimes(step=step, ranks=out_ranks, ms=values[:, :len(STAGES)],
                            p2p_ms=values[:, len(STAGES):] if self.any_p2p else None, step_ms=float(span))


class KeyIndex:
    """Dense indices 0, 1, ... for int64 keys in the order they are added (keys new in one
    call: ascending), kept as sorted arrays, so a million keys cost 16 bytes each and no
    Python object."""

    def __init__(self) -> None:
        self._keys = np.zeros(0, np.int64)  # ascending
        self._index = np.zeros(0, np.int64)  # the index of each key

    def __len__(self) -> int:
        return int(self._keys.size)

    def add(self, values: np.ndarray) -> np.ndarray:
        """(n,) the index of each of `values`, new keys taking the next indices."""
        uniq, inverse = np.unique(np.asarray(values, dtype=np.int64), return_inverse=True)
        pos = np.searchsorted(self._keys, uniq)
        known = pos < self._keys.size
        known[known] = self._keys[pos[known]] == uniq[known]
        new = ~known
        index = np.empty(uniq.size, np.int64)
        index[known] = self._index[pos[known]]
        index[new] = np.arange(self._keys.size, self._keys.size + int(new.sum()))
        if new.any():
            keys = np.concatenate((self._keys, uniq[new]))
            order = np.argsort(keys, kind="stable")
            self._keys, self._index = keys[order], np.concatenate((self._index, index[new]))[order]
        return index[inverse]

    def find(self, values: np.ndarray) -> np.ndarray:
        """(n,) the index of each of `values`, which must all have been added."""
        return self._index[np.searchsorted(self._keys, np.asarray(values, dtype=np.int64))]

    def sorted_keys(self) -> np.ndarray:
        return self._keys


# A cell's packed key: step index << 32 | rank index << 5 | column (STAGES, then P2P_OPS).
_COLUMN_BITS = 5
_COLUMN_MASK = (1 << _COLUMN_BITS) - 1
_STEP_SHIFT = 32
_RANK_MASK = (1 << (_STEP_SHIFT - _COLUMN_BITS)) - 1
_STEP_LIMIT = (1 << 31) - 1


def _summed(keys: np.ndarray, ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted distinct keys, the sum of each key's ms in the given order)."""
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    first = np.r_[True, keys[1:] != keys[:-1]]
    return keys[first], np.bincount(np.cumsum(first) - 1, weights=ms[order])


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

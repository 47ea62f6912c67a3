"""Per-op records kept by the trace readers for the what-if simulator (relax_straggler.whatif).

A reader opened with ``ops=True`` (open_source) hands every valid row of a known Megatron
op name (excluded ones such as gc and optimizer-clip-main-grad included: the simulator
replays them) to an OpCollector, after the same checks the step sums get: bad values,
duplicates and unknown names are reported once, with their row, through Problems. Memory:
about 50 bytes per kept op.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class OpRecords:
    """Columns of one record per op (times in s); optype indexes optype_names; microbatch
    and seq_id are -1 when the input has none, chunk (virtual pipeline model chunk) -1
    for ops outside any chunk."""

    dp_rank: np.ndarray  # int32
    stage: np.ndarray  # int32
    step: np.ndarray  # int64
    optype: np.ndarray  # int32
    start: np.ndarray  # float64, s
    duration: np.ndarray  # float64, s
    seq_id: np.ndarray  # int32
    microbatch: np.ndarray  # int32
    chunk: np.ndarray  # int32
    optype_names: list[str]
    rank: np.ndarray  # int64, -1 when unknown
    left_out_steps: list[int] = field(default_factory=list)  # steps the what-if replay left out (reported)

    def __len__(self) -> int:
        return len(self.dp_rank)


_COLUMNS = ("key", "step", "name", "start", "duration", "seq_id", "microbatch", "chunk")


@dataclass(frozen=True)
class Placement:
    """Where a reader's rank keys run: (n,) int64 keys and each one's dp_rank, stage and
    global rank (-1 when unknown)."""

    keys: np.ndarray
    dp_rank: np.ndarray
    stage: np.ndarray
    rank: np.ndarray

    @staticmethod
    def empty() -> "Placement":
        none = np.zeros(0, np.int64)
        return Placement(none, none, none, none)


class OpCollector:
    """Accumulates batches of op columns keyed by the reader's rank key (a rank, or a lane
    of a Chrome trace) and places them on workers at the end."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, ...]] = []
        self._names: dict[str, int] = {}

    def name_ids(self, names: list[str]) -> np.ndarray:
        """(len(names),) ids of op names in this collector's name table."""
        return np.array([self._names.setdefault(n, len(self._names)) for n in names], dtype=np.int64)

    def add(self, key: np.ndarray, step: np.ndarray, name_id: np.ndarray, start_s: np.ndarray,
            duration_s: np.ndarray, seq_id: np.ndarray, microbatch: np.ndarray, chunk: np.ndarray) -> None:
        """One batch of valid rows, (rows,) each."""
        if key.size:
            self._parts.append(tuple(np.asarray(c) for c in (key, step, name_id, start_s, duration_s, seq_id,
                                                             microbatch, chunk)))

    def records(self, placement: "Placement") -> OpRecords:
        """The ops, placed on their workers; ops of keys the placement lacks (lanes the
        reader skipped and reported) are left out."""
        cols = {c: np.concatenate([p[i] for p in self._parts]) if self._parts else np.zeros(0)
                for i, c in enumerate(_COLUMNS)}
        order = np.argsort(placement.keys, kind="stable")
        keys = placement.keys[order]
        where = np.stack([placement.dp_rank[order], placement.stage[order], placement.rank[order]], axis=1)
        key = cols["key"].astype(np.int64)
        idx = np.minimum(np.searchsorted(keys, key), max(keys.size - 1, 0))
        keep = keys[idx] == key if keys.size else np.zeros(key.shape, dtype=bool)
        idx = idx[keep]
        return OpRecords(
            dp_rank=where[idx, 0].astype(np.int32), stage=where[idx, 1].astype(np.int32),
            step=cols["step"][keep].astype(np.int64), optype=cols["name"][keep].astype(np.int32),
            start=cols["start"][keep].astype(np.float64), duration=cols["duration"][keep].astype(np.float64),
            seq_id=cols["seq_id"][keep].astype(np.int32), microbatch=cols["microbatch"][keep].astype(np.int32),
            chunk=cols["chunk"][keep].astype(np.int32), optype_names=list(self._names),
            rank=where[idx, 2].astype(np.int64))

"""Per-op records kept by the trace readers for the what-if simulator (relax_straggler.whatif).

A reader opened with ``ops=True`` (open_source) hands every valid row of a known Megatron
op name (excluded ones such as gc and optimizer-clip-main-grad included: the simulator
replays them) to an OpCollector, after the same checks the step sums get: bad values,
duplicates and unknown names are reported once, with their row, through Problems. Memory:
48 bytes per kept op while reading (in blocks of the records' own types), and at most that
plus 17 and one column's copy when records() places them (it releases each block's column
as it goes), then OpRecords' 52.
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


# The collected columns and the type each is kept in (that of OpRecords, the key's int64).
_COLUMNS = (("key", np.int64), ("step", np.int64), ("name", np.int32), ("start", np.float64),
            ("duration", np.float64), ("seq_id", np.int32), ("microbatch", np.int32), ("chunk", np.int32))


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


# Rows per block of a collected column: 32-64 MB, so that each block is a mapping of its own
# (at least glibc's largest mmap threshold) that goes back to the system when released,
# rather than heap that stays with the process; untouched pages of the last block cost no
# memory.
BLOCK_ROWS = 1 << 23
# Rows per pass of the placement's lookup in records().
LOOKUP_ROWS = 1 << 20


class OpCollector:
    """Accumulates batches of op columns keyed by the reader's rank key (a rank, or a lane
    of a Chrome trace) and places them on workers at the end."""

    def __init__(self) -> None:
        self._blocks: list[list[np.ndarray]] = []  # per block, one array per column
        self._rows = 0
        self._names: dict[str, int] = {}

    def name_ids(self, names: list[str]) -> np.ndarray:
        """(len(names),) ids of op names in this collector's name table."""
        return np.array([self._names.setdefault(n, len(self._names)) for n in names], dtype=np.int64)

    def add(self, key: np.ndarray, step: np.ndarray, name_id: np.ndarray, start_s: np.ndarray,
            duration_s: np.ndarray, seq_id: np.ndarray, microbatch: np.ndarray, chunk: np.ndarray) -> None:
        """One batch of valid rows, (rows,) each; ids within the readers' ranges (int32 for
        name, seq_id, microbatch and chunk)."""
        cols = (key, step, name_id, start_s, duration_s, seq_id, microbatch, chunk)
        done, n = 0, len(key)
        while done < n:
            at = self._rows % BLOCK_ROWS
            if at == 0:
                self._blocks.append([np.empty(BLOCK_ROWS, dtype=t) for _, t in _COLUMNS])
            take = min(n - done, BLOCK_ROWS - at)
            for block, c in zip(self._blocks[-1], cols):
                block[at:at + take] = c[done:done + take]
            done += take
            self._rows += take

    def _block_rows(self, b: int) -> int:
        return min(BLOCK_ROWS, self._rows - b * BLOCK_ROWS)

    def _take(self, i: int, keep: np.ndarray) -> np.ndarray:
        """The kept rows of column i, each block's copy of it released."""
        out = np.empty(np.count_nonzero(keep), dtype=_COLUMNS[i][1])
        at = 0
        for b, block in enumerate(self._blocks):
            lo = b * BLOCK_ROWS
            rows = block[i][:self._block_rows(b)][keep[lo:lo + BLOCK_ROWS]]
            out[at:at + rows.size] = rows
            at += rows.size
            block[i] = None
        return out

    def records(self, placement: "Placement") -> OpRecords:
        """The ops, placed on their workers; ops of keys the placement lacks (lanes the
        reader skipped and reported) are left out. Call once: the blocks are released as
        their columns are placed."""
        order = np.argsort(placement.keys, kind="stable")
        keys = placement.keys[order]

        # Two passes over the keys, LOOKUP_ROWS at a time (the lookup's temporaries stay that
        # small): which rows are kept, then where the kept ones run, into columns of the kept size.
        spans = [(b, lo, min(lo + LOOKUP_ROWS, self._block_rows(b)))
                 for b in range(len(self._blocks)) for lo in range(0, self._block_rows(b), LOOKUP_ROWS)]

        def lookup(b: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
            """The rows lo:hi of block b whose key the placement has, and those keys' places in `order`."""
            key = self._blocks[b][0][lo:hi]
            idx = np.minimum(np.searchsorted(keys, key), max(keys.size - 1, 0))
            kept = keys[idx] == key if keys.size else np.zeros(key.shape, dtype=bool)
            return kept, idx[kept]

        keep = np.concatenate([lookup(*span)[0] for span in spans]) if spans else np.zeros(0, dtype=bool)
        n = int(np.count_nonzero(keep))
        dp_rank, stage, rank = np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int64)
        at = 0
        for span in spans:
            where = order[lookup(*span)[1]]
            dp_rank[at:at + where.size] = placement.dp_rank[where]
            stage[at:at + where.size] = placement.stage[where]
            rank[at:at + where.size] = placement.rank[where]
            at += where.size
        for block in self._blocks:
            block[0] = None
        cols = {name: self._take(i, keep) for i, (name, _) in enumerate(_COLUMNS) if i > 0}
        self._blocks, self._rows = [], 0
        return OpRecords(dp_rank=dp_rank, stage=stage, step=cols["step"], optype=cols["name"], start=cols["start"],
                         duration=cols["duration"], seq_id=cols["seq_id"], microbatch=cols["microbatch"],
                         chunk=cols["chunk"], optype_names=list(self._names), rank=rank)

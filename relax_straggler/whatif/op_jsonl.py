"""Our own per-op JSONL as what-if input: one object per line with dp_rank, stage, step,
optype (a Megatron timer name), start_s, duration_s, seq_id and optionally microbatch,
chunk, rank. Read line by line (lines numbered from 1); a bad line is reported with its
line and field through Problems and skipped (strict: the first one raises InputError), as
the readers do with their rows.

Line problems: invalid JSON (or nested too deep), not UTF-8, a missing field, an id that is
not an integer in range (dp_rank, stage, rank below MAX_WORLD_SIZE, step in int64, seq_id
in int32, microbatch / chunk -1 or in int32), a time that is not a number (strings of
digits included) within MAX_TIME_S or a negative duration, an unknown op name (reported once, every line
counted), a line repeating the op of an earlier one.
"""

from __future__ import annotations

import json
import os
from typing import Optional

import numpy as np

from relax_straggler.common.topology import MAX_WORLD_SIZE
from relax_straggler.readers import OpRecords, Problems
from relax_straggler.readers.base import MAX_SMALL_ID, MAX_STEP, MAX_TIME_S, finite_number, parse_json_int, short_repr
from relax_straggler.readers.megatron_names import timer_target
from relax_straggler.whatif.errors import WhatIfInputError

OP_JSONL = "op-jsonl"
# field -> (lowest, highest, default when absent; None: required)
_IDS = {"dp_rank": (0, MAX_WORLD_SIZE - 1, None), "stage": (0, MAX_WORLD_SIZE - 1, None),
        "step": (0, MAX_STEP, None), "seq_id": (0, MAX_SMALL_ID, None), "microbatch": (-1, MAX_SMALL_ID, -1),
        "chunk": (-1, MAX_SMALL_ID, -1), "rank": (-1, MAX_WORLD_SIZE - 1, -1)}


class OpJsonlSource:
    """An op-jsonl file; records() reads it, reporting bad lines through `problems`."""

    format = OP_JSONL

    def __init__(self, path: str, problems: Problems) -> None:
        self.path = path
        self.problems = problems
        self.total_bytes = os.path.getsize(path)
        self.records_read = 0
        self._unknown: set[str] = set()

    def records(self) -> OpRecords:
        """The valid lines as OpRecords (optype indexes the sorted names). Raises
        WhatIfInputError when no line is valid, InputError (strict) at the first problem."""
        rows: list[tuple] = []
        seen: dict[tuple, int] = {}
        with open(self.path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                self.records_read = number
                if not raw.strip():
                    continue
                row = self._parse(number, raw)
                if row is None:
                    continue
                key = (row[9], row[0], row[1], row[2], row[3], row[6], row[8])
                if key in seen:
                    self.problems.report(number, f"repeats the op of line {seen[key]} (same rank, dp_rank, stage, "
                                         "step, optype, seq_id, chunk); skipped", "duplicate")
                    continue
                seen[key] = number
                rows.append(row)
        if not rows:
            first = f"; first problem: {self.problems.kept[0]}" if self.problems.kept else ""
            raise WhatIfInputError(f"{self.path}: no per-op record{first}")
        names = sorted({r[3] for r in rows})
        index = {n: i for i, n in enumerate(names)}
        cols = list(zip(*rows))
        as_int = lambda c, dtype: np.array(cols[c], dtype=dtype)  # noqa: E731
        return OpRecords(dp_rank=as_int(0, np.int32), stage=as_int(1, np.int32), step=as_int(2, np.int64),
                         optype=np.array([index[n] for n in cols[3]], dtype=np.int32),
                         start=np.array(cols[4], dtype=np.float64), duration=np.array(cols[5], dtype=np.float64),
                         seq_id=as_int(6, np.int32), microbatch=as_int(7, np.int32), chunk=as_int(8, np.int32),
                         optype_names=names, rank=as_int(9, np.int64))

    def _parse(self, line: int, raw: bytes) -> Optional[tuple]:
        """(dp_rank, stage, step, optype, start_s, duration_s, seq_id, microbatch, chunk, rank), or None (reported)."""
        try:
            o = json.loads(raw, parse_int=parse_json_int)
        except RecursionError:
            return self._bad(line, "not a per-op record: JSON nested deeper than the decoder allows")
        except ValueError as exc:  # invalid JSON or not UTF-8
            return self._bad(line, f"not a per-op record: {exc}")
        if not isinstance(o, dict):
            return self._bad(line, "not a per-op record: not a JSON object")
        ids = {}
        for name, (lo, hi, default) in _IDS.items():
            v = o.get(name, default)
            if v is None or isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                what = "missing" if name not in o else f"{short_repr(v)} is not an integer in [{lo}, {hi:,}]"
                return self._bad(line, f"{name}: {what}")
            ids[name] = v
        start, duration = finite_number(o.get("start_s")), finite_number(o.get("duration_s"))
        if start is None or abs(start) > MAX_TIME_S:
            return self._bad(line, f"start_s: {short_repr(o.get('start_s'))} is not a number of seconds in "
                                   f"[-{MAX_TIME_S:g}, {MAX_TIME_S:g}]")
        if duration is None or not 0 <= duration <= MAX_TIME_S:
            return self._bad(line, f"duration_s: {short_repr(o.get('duration_s'))} is not a number of seconds in "
                                   f"[0, {MAX_TIME_S:g}]")
        optype = o.get("optype")
        if not isinstance(optype, str):
            return self._bad(line, f"optype: {short_repr(optype)} is not an op name")
        if timer_target(optype) is None:
            if optype not in self._unknown:
                self._unknown.add(optype)
                self.problems.report(line, f"unknown op name {optype[:80]!r} (not a Megatron timer name; see "
                                     "docs/ANALYZE.md for the mapping)", "unknown_op", skipped=0)
            else:
                self.problems.counts["unknown_op"] += 1
            return None
        return (ids["dp_rank"], ids["stage"], ids["step"], optype, start, duration, ids["seq_id"], ids["microbatch"],
                ids["chunk"], ids["rank"])

    def _bad(self, line: int, message: str) -> None:
        self.problems.report(line, message, "malformed")
        return None

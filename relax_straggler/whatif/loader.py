"""Per-op records for the what-if simulator, read through the same readers as `analyze`
(relax_straggler.readers with ops=True: format detection, --strict, every problem named
with its file and row or line): parquet op traces and Chrome traces; and our own per-op
JSONL (one object per line with dp_rank, stage, step, optype, start_s, duration_s, seq_id
and optionally microbatch, chunk, rank).

dp_rank, stage and model chunk come from each record, never from a rank formula. Where a
worker (dp_rank, stage) has several tensor-parallel ranks, the one with the longest total
compute is kept: TP ranks synchronise every layer, so the slowest sets the worker's pace.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from relax_straggler.readers import OP_FORMATS, InputError, OpRecords, Source, detect_format, open_source
from relax_straggler.topology import Topology

log = logging.getLogger(__name__)

_COMPUTE = ("forward-compute", "backward-compute")
OP_JSONL = "op-jsonl"


class WhatIfInputError(InputError):
    """The input cannot be replayed; the message names the file and row or field."""


@dataclass
class OpInput:
    """Per-op records and the opened source (its problems: what was skipped, with rows);
    source is None for per-op JSONL."""

    records: OpRecords
    source: Optional[Source]


def _from_columns(cols: dict[str, np.ndarray], names: list[str], source: str) -> OpRecords:
    n = len(cols["dp_rank"])
    for key, arr in cols.items():
        if len(arr) != n:
            raise WhatIfInputError(f"{source}: column {key} has {len(arr)} rows, dp_rank has {n}")
        if arr.dtype.kind == "f" and key not in ("start", "duration") and np.isnan(arr).any():
            raise WhatIfInputError(f"{source}: column {key} has a missing value in row {int(np.argmax(np.isnan(arr)))}")
    for key in ("start", "duration"):
        bad = ~np.isfinite(cols[key]) | ((cols[key] < 0) if key == "duration" else False)
        if bad.any():
            raise WhatIfInputError(f"{source}: row {int(np.argmax(bad))}: {key} must be finite (and >= 0 for duration)")
    # Keep only the op types used, so unused dictionary entries need no role.
    used = np.flatnonzero(np.bincount(cols["optype"].astype(np.int64), minlength=len(names)))
    remap = np.full(len(names), -1, dtype=np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    rec = OpRecords(
        dp_rank=cols["dp_rank"].astype(np.int32), stage=cols["stage"].astype(np.int32),
        step=cols["step"].astype(np.int64), optype=remap[cols["optype"]], start=cols["start"].astype(np.float64),
        duration=cols["duration"].astype(np.float64), seq_id=cols["seq_id"].astype(np.int32),
        microbatch=cols.get("microbatch", np.full(n, -1)).astype(np.int32),
        chunk=cols.get("chunk", np.full(n, -1)).astype(np.int32), optype_names=[names[i] for i in used],
        rank=cols.get("rank", np.full(n, -1)).astype(np.int64))
    return one_rank_per_worker(rec)


def one_rank_per_worker(rec: OpRecords) -> OpRecords:
    """rec with only one rank per worker (dp_rank, stage): the one with the longest total
    compute (tensor-parallel ranks synchronise every layer, so the slowest sets the pace)."""
    keys = rec.dp_rank.astype(np.int64) * (1 << 20) + rec.stage
    width = int(rec.rank.max()) + 2 if len(rec) else 1
    packed, inverse = np.unique(keys * width + (rec.rank + 1), return_inverse=True)  # 1-D: faster than axis=0
    workers = packed // width  # sorted, so distinct workers are where it changes
    if len(packed) == np.count_nonzero(np.diff(workers)) + (len(workers) > 0):
        return rec
    pairs = np.stack([workers, packed % width - 1], axis=1)
    compute = np.isin(rec.optype, [i for i, n in enumerate(rec.optype_names) if n in _COMPUTE])
    totals = np.bincount(inverse, weights=np.where(compute, rec.duration, 0.0), minlength=len(pairs))
    best: dict[int, tuple[float, int]] = {}
    for (key, rank), total in zip(pairs.tolist(), totals.tolist()):
        if key not in best or total > best[key][0]:
            best[key] = (total, rank)
    mask = rec.rank == np.array([best[k][1] for k in keys.tolist()])
    log.info("several ranks per (dp_rank, stage): keeping each worker's slowest-computing rank")
    return OpRecords(*(getattr(rec, f)[mask] for f in ("dp_rank", "stage", "step", "optype", "start", "duration",
                                                      "seq_id", "microbatch", "chunk")),
                     optype_names=rec.optype_names, rank=rec.rank[mask])


def _rows_to_columns(rows: list[tuple], source: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """Columns of per-op row tuples (dp_rank, stage, step, optype name, start, duration, seq_id,
    microbatch, chunk, rank); optype becomes an index into the sorted names."""
    if not rows:
        raise WhatIfInputError(f"{source}: no per-op records")
    names = sorted({r[3] for r in rows})
    index = {n: i for i, n in enumerate(names)}
    keys = ("dp_rank", "stage", "step", "optype", "start", "duration", "seq_id", "microbatch", "chunk", "rank")
    cols = {k: np.array([index[r[3]] for r in rows] if k == "optype" else [r[i] for r in rows])
            for i, k in enumerate(keys)}
    return cols, names


def _load_jsonl(path: Path) -> OpRecords:
    rows = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                o = json.loads(line)
                rows.append((int(o["dp_rank"]), int(o["stage"]), int(o["step"]), str(o["optype"]),
                             float(o["start_s"]), float(o["duration_s"]), int(o["seq_id"]),
                             int(o.get("microbatch", -1)), int(o.get("chunk", -1)), int(o.get("rank", -1))))
            except (KeyError, TypeError, ValueError) as e:
                raise WhatIfInputError(f"{path}:{line_no}: not a per-op record ({e})") from None
    cols, names = _rows_to_columns(rows, str(path))
    return _from_columns(cols, names, str(path))


def _records_from_source(source: Source) -> OpRecords:
    for _ in source.steps():  # every row checked and reported as for `analyze`
        pass
    return records_of(source)


def records_of(source: Source) -> OpRecords:
    """The what-if records of a source opened with ops=True whose steps() were read: checked
    for what the replay needs, one rank per worker. Raises WhatIfInputError."""
    rec = source.op_records()
    if rec is None:
        raise WhatIfInputError(f"{source.path}: a {source.format} input opened without its per-op records")
    if len(rec) and (rec.seq_id < 0).any():
        raise WhatIfInputError(f"{source.path}: the what-if replay needs seq_id on every op (parquet column "
                               "seq_id, Chrome args.seq_id)")
    if len(rec) and not np.isfinite(rec.start).all():
        raise WhatIfInputError(f"{source.path}: the what-if replay needs start times (parquet column start_ts)")
    names = rec.optype_names
    cols = {"dp_rank": rec.dp_rank, "stage": rec.stage, "step": rec.step, "optype": rec.optype, "start": rec.start,
            "duration": rec.duration, "seq_id": rec.seq_id, "microbatch": rec.microbatch, "chunk": rec.chunk,
            "rank": rec.rank}
    if not len(rec):
        raise WhatIfInputError(f"{source.path}: no per-op records")
    return _from_columns(cols, names, source.path)


def _is_op_jsonl(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as f:
            first = next((line for line in f if line.strip()), "")
        return isinstance(obj := json.loads(first), dict) and "optype" in obj
    except (OSError, UnicodeDecodeError, ValueError):
        return False


def read_op_input(path: str | Path, input_format: Optional[str] = None, strict: bool = False,
                  topology: Optional[Topology] = None, meta: Optional[str] = None) -> OpInput:
    """Per-op records of a parquet op trace, a Chrome trace or our per-op JSONL, read with
    the readers' checks (strict: the first problem raises). Raises InputError (a
    WhatIfInputError for what-if specific needs) naming the file and row."""
    path = str(path)
    fmt = input_format
    if fmt is None and Path(path).is_file() and detect_format(path) == "straggler-jsonl" and _is_op_jsonl(path):
        fmt = OP_JSONL
    if fmt == OP_JSONL:
        return OpInput(_load_jsonl(Path(path)), None)
    source = open_source(path, fmt, strict=strict, topology=topology, meta=meta, ops=True)
    if source.format not in OP_FORMATS:
        raise WhatIfInputError(f"{path}: a {source.format} input has no per-op records; the what-if replay "
                               f"needs {', '.join(OP_FORMATS)} or {OP_JSONL}")
    return OpInput(_records_from_source(source), source)


def load_op_records(path: str | Path, **kwargs) -> OpRecords:
    """The records of read_op_input(path, **kwargs)."""
    return read_op_input(path, **kwargs).records

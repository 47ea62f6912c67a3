"""Per-op records for the what-if simulator, from parquet op traces (one row per op:
dp_rank, stage, rank, step, optype, start_ts, duration in s, seq_id, mc, mb_id), Chrome
traces (`ph: "X"` events, ts/dur in us, pid = dp_rank, the stage from the lane's
`thread_name` "PP rank S, TP rank T, ...", args step / model_chunk / mb_id / seq_id) and
our own per-op JSONL (one object per line with dp_rank, stage, step, optype, start_s,
duration_s, seq_id and optionally microbatch, chunk, rank).

dp_rank, stage and model chunk come from each record, never from a rank formula. Where a
worker (dp_rank, stage) has several tensor-parallel ranks, the one with the longest total
compute is kept: TP ranks synchronise every layer, so the slowest sets the worker's pace.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

_COMPUTE = ("forward-compute", "backward-compute")
_LANE = re.compile(r"PP rank (\d+)")


class WhatIfInputError(ValueError):
    """The input cannot be replayed; the message names the file and row or field."""


@dataclass
class OpRecords:
    """Columns of one record per op (times in s); optype indexes optype_names."""

    dp_rank: np.ndarray  # int32
    stage: np.ndarray  # int32
    step: np.ndarray  # int64
    optype: np.ndarray  # int32
    start: np.ndarray  # float64, s
    duration: np.ndarray  # float64, s
    seq_id: np.ndarray  # int32
    microbatch: np.ndarray  # int32
    chunk: np.ndarray  # int32, -1 = none
    optype_names: list[str]
    rank: np.ndarray  # int64, -1 when unknown

    def __len__(self) -> int:
        return len(self.dp_rank)


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
    used = np.unique(cols["optype"])
    remap = np.full(len(names), -1, dtype=np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    rec = OpRecords(
        dp_rank=cols["dp_rank"].astype(np.int32), stage=cols["stage"].astype(np.int32),
        step=cols["step"].astype(np.int64), optype=remap[cols["optype"]], start=cols["start"].astype(np.float64),
        duration=cols["duration"].astype(np.float64), seq_id=cols["seq_id"].astype(np.int32),
        microbatch=cols.get("microbatch", np.full(n, -1)).astype(np.int32),
        chunk=cols.get("chunk", np.zeros(n)).astype(np.int32), optype_names=[names[i] for i in used],
        rank=cols.get("rank", np.full(n, -1)).astype(np.int64))
    return _one_rank_per_worker(rec)


def _one_rank_per_worker(rec: OpRecords) -> OpRecords:
    keys = rec.dp_rank.astype(np.int64) * (1 << 20) + rec.stage
    pairs, inverse = np.unique(np.stack([keys, rec.rank], axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(pairs) == len(np.unique(keys)):
        return rec
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


def _load_parquet(path: Path) -> OpRecords:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    need = {"dp_rank", "stage", "step", "optype", "start_ts", "duration", "seq_id"}
    missing = need - set(table.column_names)
    if missing:
        raise WhatIfInputError(f"{path}: missing columns {sorted(missing)} (need {sorted(need)})")
    opt = table.column("optype").combine_chunks()
    if hasattr(opt, "dictionary"):
        names, codes = [str(x) for x in opt.dictionary.to_pylist()], np.asarray(opt.indices)
    else:
        names, codes = np.unique(np.asarray(opt.to_pylist(), dtype=object), return_inverse=True)
        names = [str(x) for x in names]
    col = lambda k: np.asarray(table.column(k).to_numpy(zero_copy_only=False))  # noqa: E731
    cols = {"dp_rank": col("dp_rank"), "stage": col("stage"), "step": col("step"), "optype": codes,
            "start": col("start_ts").astype(np.float64), "duration": col("duration").astype(np.float64),
            "seq_id": col("seq_id")}
    for ours, theirs in (("microbatch", "mb_id"), ("chunk", "mc"), ("rank", "rank")):
        if theirs in table.column_names:
            cols[ours] = col(theirs)
    return _from_columns(cols, names, str(path))


def _rows_to_columns(rows: list[tuple], source: str) -> tuple[dict[str, np.ndarray], list[str]]:
    if not rows:
        raise WhatIfInputError(f"{source}: no per-op records")
    names = sorted({r[3] for r in rows})
    index = {n: i for i, n in enumerate(names)}
    keys = ("dp_rank", "stage", "step", "optype", "start", "duration", "seq_id", "microbatch", "chunk", "rank")
    cols = {k: np.array([r[i] if k != "optype" else index[r[i]] for r in rows]) for i, k in enumerate(keys)}
    return cols, names


def _load_chrome(path: Path) -> OpRecords:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    lanes: dict[tuple[int, int], tuple[int, int]] = {}
    for ev in events:
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            name = str(ev.get("args", {}).get("name", ""))
            m = _LANE.search(name)
            if m:
                tp = re.search(r"TP rank (\d+)", name)
                lanes[(ev["pid"], ev["tid"])] = (int(m.group(1)), int(tp.group(1)) if tp else 0)
    rows = []
    for i, ev in enumerate(events):
        if ev.get("ph") != "X":
            continue
        args = ev.get("args", {})
        lane = lanes.get((ev.get("pid"), ev.get("tid")))
        if lane is None or "step" not in args or "seq_id" not in args:
            raise WhatIfInputError(f"{path}: event {i} ({ev.get('name')}) lacks a 'PP rank' lane name or "
                                   f"args.step / args.seq_id")
        dp = int(ev["pid"])
        rows.append((dp, lane[0], int(args["step"]), str(ev["name"]), float(ev["ts"]) * 1e-6,
                     float(ev["dur"]) * 1e-6, int(args["seq_id"]), int(args.get("mb_id", -1)),
                     int(args.get("model_chunk", 0)), dp * (1 << 20) + lane[1]))
    cols, names = _rows_to_columns(rows, str(path))
    return _from_columns(cols, names, str(path))


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
                             int(o.get("microbatch", -1)), int(o.get("chunk", 0)), int(o.get("rank", -1))))
            except (KeyError, TypeError, ValueError) as e:
                raise WhatIfInputError(f"{path}:{line_no}: not a per-op record ({e})") from None
    cols, names = _rows_to_columns(rows, str(path))
    return _from_columns(cols, names, str(path))


def load_op_records(path: str | Path) -> OpRecords:
    """Reads per-op records from a parquet op trace, a Chrome trace (.json / .json.gz) or our
    per-op JSONL. Raises WhatIfInputError naming the file and row."""
    p = Path(path)
    if not p.exists():
        raise WhatIfInputError(f"{p}: no such file")
    name = p.name.lower()
    if name.endswith(".parquet"):
        return _load_parquet(p)
    if name.endswith(".jsonl"):
        return _load_jsonl(p)
    if name.endswith(".json") or name.endswith(".json.gz"):
        return _load_chrome(p)
    raise WhatIfInputError(f"{p}: unknown format (expected .parquet, .json, .json.gz or .jsonl)")

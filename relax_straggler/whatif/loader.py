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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

import numpy as np

from relax_straggler.common.topology import MAX_WORLD_SIZE, Topology
from relax_straggler.readers import OP_FORMATS, InputError, OpRecords, Problems, Source, detect_format, open_source
from relax_straggler.whatif.complete import chunks, complete_steps, distinct
from relax_straggler.whatif.errors import WhatIfInputError
from relax_straggler.whatif.op_jsonl import OP_JSONL, OpJsonlSource

log = logging.getLogger(__name__)

_COMPUTE = ("forward-compute", "backward-compute")


@dataclass
class OpInput:
    """Per-op records, the opened source (None for per-op JSONL), the input's problems (what
    was skipped, with its file and row or line, and the steps left out of the replay) and
    the records read (rows, events or lines, skipped ones included)."""

    records: OpRecords
    source: Optional[Source]
    problems: Problems
    format: str
    records_read: int


def _used_optypes(rec: OpRecords) -> OpRecords:
    """rec with only the op types it uses in its name table, so unused entries need no role."""
    names = rec.optype_names
    used = np.flatnonzero(np.bincount(rec.optype.astype(np.int64), minlength=len(names)))
    if used.size == len(names):
        return rec
    remap = np.full(len(names), -1, dtype=np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    return replace(rec, optype=remap[rec.optype], optype_names=[names[i] for i in used])


def replayable(rec: OpRecords, problems: Problems, records_read: int) -> OpRecords:
    """The records the replay models: used op types only, one rank per worker, complete
    steps only (whatif/complete.py; what is left out is reported). Raises WhatIfInputError
    when too much of the input was skipped for the rest to be the recorded job
    (readers.Problems.unusable over the `records_read` rows, events or lines), or nothing
    is left."""
    why = problems.unusable(records_read)
    if why is not None:
        first = f"; first problem: {problems.kept[0]}" if problems.kept else ""
        raise WhatIfInputError(f"{problems.path}: inconclusive: {why}, so a replay of the rest would model another "
                               "job; fix the input or the layout (--meta, --dp/--pp/--tp/--dsp)" + first)
    if not len(rec):
        raise WhatIfInputError(f"{problems.path}: no per-op records")
    return complete_steps(one_rank_per_worker(_used_optypes(rec)), problems)


def _one_rank_each(rec: OpRecords) -> bool:
    """Whether every worker (dp_rank, stage) runs one rank, by a table from rank to worker
    (the readers' ranks are below MAX_WORLD_SIZE; False above) filled, then checked, a chunk
    of records at a time: no sort of the records, whose temporaries would double a large
    trace's memory."""
    if not len(rec) or rec.rank.max() < 0:
        return True  # no rank known: each worker's one rank is "unknown"
    if rec.rank.max() >= MAX_WORLD_SIZE:
        return False  # no table that large: the sort decides
    table = np.full(int(rec.rank.max()) + 2, -1, dtype=np.int64)  # rank + 1 -> its worker
    for filling in (True, False):
        for part in chunks(len(rec)):
            slot = rec.rank[part] + 1
            worker = (rec.dp_rank[part].astype(np.int64) << 20) | rec.stage[part]
            if filling:
                table[slot] = worker
            elif not np.array_equal(table[slot], worker):
                return False  # a rank on two workers, or unknown ranks on several
    owners = table[table >= 0]
    return distinct(owners).size == owners.size


def one_rank_per_worker(rec: OpRecords) -> OpRecords:
    """rec with only one rank per worker (dp_rank, stage): the one with the longest total
    compute (tensor-parallel ranks synchronise every layer, so the slowest sets the pace)."""
    if _one_rank_each(rec):
        return rec
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


def _records_from_source(source: Source) -> OpRecords:
    for _ in source.steps():  # every row checked and reported as for `analyze`
        pass
    return records_of(source)


def records_of(source: Source) -> OpRecords:
    """The what-if records of a source opened with ops=True whose steps() were read: checked
    for what the replay needs, one rank per worker, complete steps (the others reported in
    source.problems). Raises WhatIfInputError."""
    rec = source.op_records()
    if rec is None:
        raise WhatIfInputError(f"{source.path}: a {source.format} input opened without its per-op records")
    if len(rec) and (rec.seq_id < 0).any():
        raise WhatIfInputError(f"{source.path}: the what-if replay needs seq_id on every op (parquet column "
                               "seq_id, Chrome args.seq_id)")
    if len(rec) and not np.isfinite(rec.start).all():
        raise WhatIfInputError(f"{source.path}: the what-if replay needs start times (parquet column start_ts)")
    return replayable(rec, source.problems, source.records)


_SNIFF_LINES = 64  # damaged lines looked past for the first record that decides the format


def _is_op_jsonl(path: str) -> bool:
    """Whether the first JSON object among the first _SNIFF_LINES non-blank lines has an
    optype key (a damaged first line does not decide: the reader reports it)."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = (line for line in f if line.strip())
            for _, line in zip(range(_SNIFF_LINES), lines):
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                return isinstance(obj, dict) and "optype" in obj
    except (OSError, UnicodeDecodeError):
        pass
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
        if not Path(path).is_file():
            raise InputError(f"{path}: no such file")
        problems = Problems(path, strict=strict)
        jsonl = OpJsonlSource(path, problems)
        records = jsonl.records()
        return OpInput(replayable(records, problems, jsonl.records_read), None, problems, OP_JSONL, jsonl.records_read)
    source = open_source(path, fmt, strict=strict, topology=topology, meta=meta, ops=True)
    if source.format not in OP_FORMATS:
        raise WhatIfInputError(f"{path}: a {source.format} input has no per-op records; the what-if replay "
                               f"needs {', '.join(OP_FORMATS)} or {OP_JSONL}")
    return OpInput(_records_from_source(source), source, source.problems, source.format, source.records)


def load_op_records(path: str | Path, **kwargs) -> OpRecords:
    """The records of read_op_input(path, **kwargs)."""
    return read_op_input(path, **kwargs).records

"""Readers of recorded runs: one module per input format, one common output (base.py).

    open_source(path, format=None, strict=False, topology=None, meta=None) -> Source

Formats (``--format`` of ``relax-straggler analyze``; detected from the name and the
first bytes when not given):

    straggler-jsonl   our own straggler.jsonl (reporters/jsonl.py)
    megatron-log      Megatron-LM log with Timers output (all, minmax or max form)
    chrome-trace      Chrome trace (JSON, optionally gzip) with Megatron timer op names
    parquet-trace     per-op parquet trace (dp_rank, stage, rank, step, optype, duration)

and, instead of a file, a job in a ClickHouse megatron_metrics table:
``clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]`` (readers/clickhouse.py).

A new format registers a class with the Source protocol's constructor
``(path, problems, topology=None, meta=None)`` in READERS. The per-op trace readers also
take ``ops=True`` and then keep their valid ops for the what-if simulator
(``source.op_records()``, readers/op_records.py).
"""

from __future__ import annotations

import os
from typing import Optional

from relax_straggler.readers.base import P2P_OPS, InputError, MinMaxStep, Problem, Problems, Source, Step, StepTimes
from relax_straggler.readers.chrome_trace import ChromeTraceReader
from relax_straggler.readers.megatron_log import MegatronLogReader
from relax_straggler.readers.op_records import OpRecords
from relax_straggler.readers.parquet_trace import ParquetTraceReader
from relax_straggler.readers.straggler_jsonl import StragglerJsonlReader

READERS = {
    StragglerJsonlReader.format: StragglerJsonlReader,
    MegatronLogReader.format: MegatronLogReader,
    ChromeTraceReader.format: ChromeTraceReader,
    ParquetTraceReader.format: ParquetTraceReader,
}

# Formats with per-op records (start, duration, step, seq_id per op): what-if input.
OP_FORMATS = (ChromeTraceReader.format, ParquetTraceReader.format)

__all__ = ["OP_FORMATS", "OpRecords", "P2P_OPS", "READERS",
           "InputError", "MinMaxStep", "Problem", "Problems", "Source", "Step", "StepTimes",
           "detect_format", "open_source"]


def detect_format(path: str) -> str:
    """The format of `path` from its name, else from its first bytes. Raises InputError."""
    name = os.path.basename(path).lower()
    if name.endswith(".parquet"):
        return ParquetTraceReader.format
    if name.endswith((".json", ".json.gz")):
        return ChromeTraceReader.format
    if name.endswith(".jsonl"):
        return StragglerJsonlReader.format
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if head[:4] == b"PAR1":
        return ParquetTraceReader.format
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] == b"[":
        return ChromeTraceReader.format
    if head.lstrip()[:1] == b"{":
        return ChromeTraceReader.format if b'"traceEvents"' in head else StragglerJsonlReader.format
    return MegatronLogReader.format


def open_source(path: str, format: Optional[str] = None, strict: bool = False, topology: Optional[Topology] = None,
                meta: Optional[str] = None, ops: bool = False) -> Source:
    """Opens `path` with the reader for `format` (detected when None), or the ClickHouse
    input ``clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]`` (readers/clickhouse.py).
    ops: keep the per-op records where the format has them (OP_FORMATS; others ignore it).
    Raises InputError for a missing file, an unknown format, or a header the reader rejects."""
    if path.startswith("clickhouse://"):
        if format is not None or meta is not None:
            raise InputError(f"{path}: --input-format and --meta apply to files, not to a ClickHouse input")
        from relax_straggler.readers.clickhouse import open_clickhouse  # the store client only when asked

        return open_clickhouse(path, strict=strict, topology=topology)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not an input file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    fmt = format or detect_format(path)
    if fmt not in READERS:
        raise InputError(f"{path}: unknown format {fmt!r}; formats: {', '.join(READERS)}")
    problems = Problems(path, strict=strict)
    if ops and fmt in OP_FORMATS:
        return READERS[fmt](path, problems, topology=topology, meta=meta, ops=True)
    return READERS[fmt](path, problems, topology=topology, meta=meta)

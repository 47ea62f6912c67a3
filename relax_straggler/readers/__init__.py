"""Readers of recorded runs: one module per input format, one common output (base.py).

    open_source(path, format=None, strict=False, topology=None, meta=None) -> Source

Formats (``--format`` of ``relax-straggler analyze``; detected from the name and the
first bytes when not given):

    straggler-jsonl   our own straggler.jsonl (reporters/jsonl.py)
    megatron-log      Megatron-LM log with Timers output (all, minmax or max form)
    chrome-trace      Chrome trace (JSON, optionally gzip) with Megatron timer op names
    parquet-trace     per-op parquet trace (dp_rank, stage, rank, step, optype, duration)

and, instead of a file, a job in a metrics store (a ClickHouse megatron_metrics table or a
file store): ``clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]`` or ``file://DIR?job=ID...``
(readers/store_input.py).

A new format registers its module and class (the Source protocol's constructor
``(path, problems, topology=None, meta=None)``) in READERS; a reader's module is imported
only when its format is opened, so a command pays only for the readers it uses. The per-op
trace readers also take ``ops=True`` and then keep their valid ops for the what-if simulator
(``source.op_records()``, readers/op_records.py).
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Optional

from relax_straggler.readers.base import P2P_OPS, InputError, MinMaxStep, Problem, Problems, Source, Step, StepTimes
from relax_straggler.readers.op_records import OpRecords

if TYPE_CHECKING:
    from relax_straggler.common.topology import Topology

STRAGGLER_JSONL = "straggler-jsonl"
MEGATRON_LOG = "megatron-log"
CHROME_TRACE = "chrome-trace"
PARQUET_TRACE = "parquet-trace"

# format -> (module under relax_straggler.readers, reader class); the class's `format` is the key.
READERS = {
    STRAGGLER_JSONL: ("straggler_jsonl", "StragglerJsonlReader"),
    MEGATRON_LOG: ("megatron_log", "MegatronLogReader"),
    CHROME_TRACE: ("chrome_trace", "ChromeTraceReader"),
    PARQUET_TRACE: ("parquet_trace", "ParquetTraceReader"),
}

# Formats with per-op records (start, duration, step, seq_id per op): what-if input.
OP_FORMATS = (CHROME_TRACE, PARQUET_TRACE)

__all__ = ["OP_FORMATS", "OpRecords", "P2P_OPS", "READERS",
           "InputError", "MinMaxStep", "Problem", "Problems", "Source", "Step", "StepTimes",
           "detect_format", "open_source", "reader_class"]


def reader_class(fmt: str) -> type:
    """The reader class of a format in READERS, importing its module. Raises KeyError."""
    module, name = READERS[fmt]
    return getattr(importlib.import_module(f"relax_straggler.readers.{module}"), name)


def detect_format(path: str) -> str:
    """The format of `path` from its name, else from its first bytes. Raises InputError."""
    name = os.path.basename(path).lower()
    if name.endswith(".parquet"):
        return PARQUET_TRACE
    if name.endswith((".json", ".json.gz")):
        return CHROME_TRACE
    if name.endswith(".jsonl"):
        return STRAGGLER_JSONL
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if head[:4] == b"PAR1":
        return PARQUET_TRACE
    if head[:2] == b"\x1f\x8b" or head.lstrip()[:1] == b"[":
        return CHROME_TRACE
    if head.lstrip()[:1] == b"{":
        return CHROME_TRACE if b'"traceEvents"' in head else STRAGGLER_JSONL
    return MEGATRON_LOG


def open_source(path: str, format: Optional[str] = None, strict: bool = False, topology: Optional[Topology] = None,
                meta: Optional[str] = None, ops: bool = False) -> Source:
    """Opens `path` with the reader for `format` (detected when None), or a job in a metrics
    store, ``clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]`` or ``file://DIR?job=ID...``
    (readers/store_input.py).
    ops: keep the per-op records where the format has them (OP_FORMATS; others ignore it).
    Raises InputError for a missing file, an unknown format, or a header the reader rejects."""
    if path.startswith(("clickhouse://", "file://")):
        if format is not None or meta is not None:
            raise InputError(f"{path}: --input-format and --meta apply to files, not to a metrics store")
        from relax_straggler.readers.store_input import open_store_input  # the store client only when asked

        return open_store_input(path, strict=strict, topology=topology)
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not an input file")
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such file")
    fmt = format or detect_format(path)
    if fmt not in READERS:
        raise InputError(f"{path}: unknown format {fmt!r}; formats: {', '.join(READERS)}")
    problems = Problems(path, strict=strict)
    reader = reader_class(fmt)
    if ops and fmt in OP_FORMATS:
        return reader(path, problems, topology=topology, meta=meta, ops=True)
    return reader(path, problems, topology=topology, meta=meta)

"""Rows to and from ClickHouse's wire formats, column by column in Arrow (no Python object
per row on the write path).

Two formats: ArrowStream on servers that have it (20.x and later: about 5x faster both
ways, docs/PERFORMANCE.md) and TabSeparated on the others (18.16 has neither Arrow nor
query parameters). The insert's columns follow the table's Layout
(relax_straggler.stores.clickhouse_layout).
"""

from __future__ import annotations

import io
import re
from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.stores.base import SAMPLE_SCHEMA, Sample, table_to_samples
from relax_straggler.stores.clickhouse_layout import ATTRIBUTE_FIELDS, FIELDS, VALUES_KEY, Layout

# TabSeparated escapes, backslash first (ClickHouse reads these back).
_TSV_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\0", "\\0"))
_TSV_UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f", "\\": "\\", "'": "'"}
_TSV_UNESCAPE = re.compile(r"\\(.)", re.S)
# JSON string escapes: backslash and quote first, then every control character.
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
                 *((chr(c), f"\\u{c:04x}") for c in range(32) if chr(c) not in "\n\r\t"))


def insert_table(table: pa.Table, layout: Layout) -> pa.Table:
    """The columns to insert into `layout`'s table from a checked SAMPLE_SCHEMA table."""
    total_ms = pc.cast(pc.round(pc.multiply(table.column("timestamp"), 1000.0)), pa.int64())
    out: dict[str, pa.ChunkedArray] = {}
    if layout.datetime64:
        out["timestamp"] = pc.cast(total_ms, pa.timestamp("ms"))
    else:
        seconds = pc.divide(total_ms, 1000)  # integer division: timestamps are >= 0
        out["timestamp"] = pc.cast(seconds, pa.uint32())
        if "timestamp_ms" in layout.columns:
            out["timestamp_ms"] = pc.cast(pc.subtract(total_ms, pc.multiply(seconds, 1000)), pa.uint16())
    out[layout.job_column] = table.column("job")
    out["metric_name"] = table.column("metric_name")
    unsigned = layout.type_of("iteration").startswith("UInt")
    out["iteration"] = pc.cast(table.column("iteration"), pa.uint64() if unsigned else pa.int64())
    values = table.column("metric_values")
    if "metric_values" in layout.columns:
        out["metric_values"] = values
    else:
        out["value"] = pc.list_element(values, 0)
    in_attributes = []
    for field in ATTRIBUTE_FIELDS:
        if layout.place_of(field) == "column":
            out[field] = table.column(field)
        else:
            in_attributes.append(field)
    if layout.attributes_kind is not None:
        out["attributes"] = _attributes(table, in_attributes, keep_values="metric_values" not in layout.columns)
    return pa.table(out)


def _attributes(table: pa.Table, fields: list[str], keep_values: bool) -> pa.ChunkedArray:
    """One JSON object per row: `fields` of the row, and "values" when a row has several."""
    def text(name: str) -> pa.ChunkedArray:
        col = table.column(name)
        for raw, escaped in _JSON_ESCAPES:
            col = pc.replace_substring(col, raw, escaped)
        return pc.binary_join_element_wise('"', col, '"', "")

    parts = []
    for field in fields:
        value = pc.cast(table.column(field), pa.string()) if field == "rank" else text(field)
        parts += [f'"{field}":', value, ","]
    values = table.column("metric_values")
    if keep_values:
        listed = pc.binary_join_element_wise(f'"{VALUES_KEY}":[', _joined(values), "],", "")
        several = pc.greater(pc.list_value_length(values), 1)
        parts.append(pc.if_else(several, listed, pa.scalar("", pa.string())))
    joined = pc.binary_join_element_wise("{", *parts, "")
    return pc.binary_join_element_wise(pc.utf8_rtrim(joined, ","), "}", "")


def _joined(values: pa.ChunkedArray) -> pa.ChunkedArray:
    # Arrow prints float64 in the shortest form that reads back exactly.
    return pc.binary_join(pc.cast(values, pa.list_(pa.string())), ",")


def arrow_body(table: pa.Table) -> bytes:
    """`table` as one ArrowStream (INSERT ... FORMAT ArrowStream)."""
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def tsv_body(table: pa.Table) -> bytes:
    """`table` as TabSeparated rows, in its column order (INSERT ... FORMAT TabSeparated)."""
    columns = []
    for name in table.column_names:
        col = table.column(name)
        if pa.types.is_timestamp(col.type):  # DateTime64(3) reads "seconds.mmm"
            ms = pc.cast(col, pa.int64())
            seconds = pc.divide(ms, 1000)
            frac = pc.utf8_lpad(pc.cast(pc.subtract(ms, pc.multiply(seconds, 1000)), pa.string()), 3, "0")
            col = pc.binary_join_element_wise(pc.cast(seconds, pa.string()), frac, ".")
        elif pa.types.is_list(col.type):
            col = pc.binary_join_element_wise("[", _joined(col), "]", "")
        elif pa.types.is_string(col.type):
            for raw, escaped in _TSV_ESCAPES:
                col = pc.replace_substring(col, raw, escaped)
        columns.append(pc.cast(col, pa.string()))
    lines = pc.binary_join_element_wise(*columns, "\t").combine_chunks()
    one = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    return pc.binary_join(one, "\n")[0].as_buffer().to_pybytes() + b"\n"


def _untsv(field: str) -> str:
    return _TSV_UNESCAPE.sub(lambda m: _TSV_UNESCAPES.get(m.group(1), m.group(1)), field) if "\\" in field else field


def tsv_strings(lines: Iterable[str]) -> list[str]:
    """The single string column of a TabSeparated answer."""
    return [_untsv(line) for line in lines if line]


def tsv_samples(lines: Iterable[str]) -> Iterator[Sample]:
    """Samples of a TabSeparated answer to a SELECT of Layout.select()."""
    for line in lines:
        if not line:
            continue
        (ts_ms, job, metric, subname, rank, iteration, node, cluster, values) = line.split("\t")
        inner = values[1:-1]
        yield Sample(timestamp=int(ts_ms) / 1000.0, job=_untsv(job), metric_name=_untsv(metric),
                     rank=int(rank), iteration=int(iteration),
                     values=tuple(float(v) for v in inner.split(",")) if inner else (),
                     subname=_untsv(subname), node=_untsv(node), cluster=_untsv(cluster))


def arrow_tables(chunks: Iterator[bytes]) -> Iterator[pa.Table]:
    """SAMPLE_SCHEMA tables of an ArrowStream answer to a SELECT of Layout.select(), one
    per record batch as it arrives (a batch may end inside an iteration). Column by column:
    no Python object per row."""
    # Buffered: its read(n) returns n bytes unless the answer ended, as Arrow's reader expects.
    reader = pa.ipc.open_stream(io.BufferedReader(_ChunkReader(chunks), buffer_size=1 << 20))
    for batch in reader:
        yield sample_table(batch)


def sample_table(batch: pa.RecordBatch) -> pa.Table:
    """The SAMPLE_SCHEMA table of one answer batch of Layout.select() (its `_<field>`
    columns; timestamp from ms to s)."""
    cols = {}
    for f in FIELDS:
        col = batch.column(f"_{f}")
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):  # servers before 23.x
            col = col.cast(pa.string())
        cols[f] = col
    cols["timestamp"] = pc.divide(pc.cast(cols.pop("ts_ms"), pa.float64()), 1000.0)
    return pa.table({name: cols[name] for name in SAMPLE_SCHEMA.names}).cast(SAMPLE_SCHEMA)


def arrow_samples(chunks: Iterator[bytes]) -> Iterator[Sample]:
    """Samples of an ArrowStream answer to a SELECT of Layout.select(), batch by batch."""
    for table in arrow_tables(chunks):
        yield from table_to_samples(table)


class _ChunkReader(io.RawIOBase):
    """A readable file over an iterator of byte chunks (for pyarrow's stream reader)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._buffer = iter(chunks), b""

    def readable(self) -> bool:
        return True

    def readinto(self, out) -> int:
        while not self._buffer:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buffer = chunk
        n = min(len(out), len(self._buffer))
        out[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

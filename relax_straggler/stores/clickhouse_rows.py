"""Rows to and from the Arrow tables the ClickHouse client sends and receives, column by
column (no Python object per row on the write path).

The insert's columns follow the table's Layout (relax_straggler.stores.clickhouse_layout);
an answer's batches are those of a SELECT of Layout.select().
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.stores.base import SAMPLE_SCHEMA, Sample, table_to_samples
from relax_straggler.stores.clickhouse_layout import ATTRIBUTE_FIELDS, FIELDS, VALUES_KEY, Layout

# JSON string escapes: backslash and quote first, then every control character.
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
                 *((chr(c), f"\\u{c:04x}") for c in range(32) if chr(c) not in "\n\r\t"))


def insert_table(table: pa.Table, layout: Layout) -> pa.Table:
    """The columns to insert into `layout`'s table from a checked SAMPLE_SCHEMA table."""
    total_ms = pc.cast(pc.round(pc.multiply(table.column("timestamp"), 1000.0)), pa.int64())
    out: dict[str, pa.ChunkedArray] = {}
    if layout.datetime64:
        out["timestamp"] = pc.cast(total_ms, pa.timestamp("ms"))
    else:  # whole seconds; integer division: timestamps are >= 0
        out["timestamp"] = pc.cast(pc.divide(total_ms, 1000), pa.uint32())
    out[layout.job_column] = _labels(table.column("job"))
    out["metric_name"] = _labels(table.column("metric_name"))
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
            out[field] = table.column(field) if field == "rank" else _labels(table.column(field))
        else:
            in_attributes.append(field)
    if layout.attributes_kind is not None:
        out["attributes"] = _attributes(table, in_attributes, keep_values="metric_values" not in layout.columns)
    return pa.table(out)


def _labels(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A string column of few distinct values (job, timer, node, cluster) as an Arrow
    dictionary: the server reads it into its String column, and the insert is a third
    smaller and about 4x faster to encode (docs/PERFORMANCE.md)."""
    return pc.dictionary_encode(column)


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


def arrow_tables(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.Table]:
    """SAMPLE_SCHEMA tables of the answer to a SELECT of Layout.select(), one per record
    batch as it arrives (a batch may end inside an iteration). Column by column: no Python
    object per row."""
    for batch in batches:
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


def arrow_samples(batches: Iterable[pa.RecordBatch]) -> Iterator[Sample]:
    """Samples of the answer to a SELECT of Layout.select(), batch by batch."""
    for table in arrow_tables(batches):
        yield from table_to_samples(table)

"""Rows to and from the Arrow tables the ClickHouse client sends and receives, column by
column (no Python object per row on the write path).

The insert's columns follow the table's Layout (relax_straggler.stores.clickhouse_layout);
an answer's batches are those of a SELECT of Layout.select().
"""

from __future__ import annotations

from typing import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.stores.base import SAMPLE_SCHEMA, Sample, StoreError, table_to_samples
from relax_straggler.stores.clickhouse_layout import ATTRIBUTE_FIELDS, FIELDS, VALUES_KEY, Layout

# JSON string escapes: backslash and quote first, then every control character.
_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"),
                 *((chr(c), f"\\u{c:04x}") for c in range(32) if chr(c) not in "\n\r\t"))


# What each integer column type holds: a value outside is refused, never wrapped.
_INTEGER_RANGES = {f"{u}Int{bits}": ((0, 2**bits - 1) if u else (-2**(bits - 1), 2**(bits - 1) - 1))
                   for u in ("U", "") for bits in (8, 16, 32, 64)}


def insert_table(table: pa.Table, layout: Layout) -> pa.Table:
    """The columns to insert into `layout`'s table from a checked SAMPLE_SCHEMA table.
    Raises StoreError naming the table, the field and the first row that it cannot keep
    whole: a rank or iteration its integer column type cannot hold, several values where
    it keeps one (``value`` and no ``attributes``)."""
    for name in ("rank", "iteration"):
        if name in layout.columns:
            _check_range(table, layout, name)
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
        if layout.attributes_kind is None:
            several = pc.indices_nonzero(pc.greater(pc.list_value_length(values), 1))
            if len(several):
                i = several[0].as_py()
                raise StoreError(f"table {layout.table} keeps one value per row (a value column and no attributes "
                                 f"column): row {i} has {len(values[i])} values; refusing to write rows that would "
                                 "lose them (docs/STORES.md)")
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


def _check_range(table: pa.Table, layout: Layout, name: str) -> None:
    bounds = _INTEGER_RANGES.get(layout.type_of(name))
    if bounds is None:
        return
    column = table.column(name)
    lowest, highest = (v.as_py() for v in pc.min_max(column).values())
    if bounds[0] <= lowest and highest <= bounds[1]:
        return
    low, high = (pa.scalar(max(bounds[0], -2**63), pa.int64()), pa.scalar(min(bounds[1], 2**63 - 1), pa.int64()))
    outside = pc.indices_nonzero(pc.or_(pc.less(column, low), pc.greater(column, high)))
    if len(outside):
        i = outside[0].as_py()
        raise StoreError(f"table {layout.table}: column {name} is {layout.type_of(name)}, which cannot hold "
                         f"{name} {column[i].as_py()} of row {i}; refusing to write it wrapped (docs/STORES.md)")


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

"""The layouts of a metrics table the ClickHouse store reads and writes, from its columns.

The store reads the table's columns (system.columns) and maps each Sample field onto
them, so tables that exist in the field are used as they are:

- the store's own table (``own_ddl``): ``timestamp DateTime64(3)``, ``job``, ``metric_name``,
  ``subname``, ``rank``, ``iteration``, ``node``, ``cluster``, ``metric_values Array(Float64)``;
- the Megatron metrics layout: ``timestamp DateTime, job_id String, metric_name String,
  iteration UInt64, value Float64, attributes JSON`` (or ``Object('json')`` or ``String``):
  one value per row; rank, subname, node and cluster are keys of ``attributes`` and a row
  of several values keeps them all under ``attributes.values``.

A field with neither a column nor a place in ``attributes`` reads as 0 / ''; writing a
row to such a table raises StoreError naming the field (nothing is silently dropped).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from relax_straggler.stores.base import StoreError

# The attribute keys of the Megatron layout (JSON object keys).
ATTRIBUTE_FIELDS = ("rank", "subname", "node", "cluster")
VALUES_KEY = "values"

# What each read returns, in this order (the SELECT list of ``Layout.select``).
FIELDS = ("ts_ms", "job", "metric_name", "subname", "rank", "iteration", "node", "cluster", "metric_values")


def own_ddl(table: str) -> str:
    """CREATE TABLE IF NOT EXISTS of the store's own table `table` (already quoted)."""
    return (f"CREATE TABLE IF NOT EXISTS {table} (timestamp DateTime64(3), job String, metric_name String, "
            "subname String, rank Int32, iteration Int64, node String, cluster String, "
            "metric_values Array(Float64)) ENGINE = MergeTree PARTITION BY toYYYYMMDD(timestamp) "
            "ORDER BY (job, metric_name, rank, iteration)")


def _base_type(ch_type: str) -> str:
    """'LowCardinality(Nullable(String))' -> 'String'."""
    for wrapper in ("LowCardinality(", "Nullable("):
        while ch_type.startswith(wrapper):
            ch_type = ch_type[len(wrapper):-1]
    return ch_type


@dataclass(frozen=True)
class Layout:
    """How Sample fields map onto the columns of one table.

    columns: name -> ClickHouse type, as system.columns lists them; engine: the table's
    engine as system.tables names it ('' when unknown). Raises StoreError
    (naming `table`) when a column every layout needs is missing: a timestamp, a job
    (``job`` or ``job_id``), ``metric_name``, ``iteration`` and the values
    (``metric_values`` or ``value``).
    """

    table: str
    columns: Mapping[str, str]
    engine: str = ""

    def __post_init__(self) -> None:
        missing = [what for what, names in (("timestamp", ("timestamp",)), ("job", ("job", "job_id")),
                                            ("metric_name", ("metric_name",)), ("iteration", ("iteration",)),
                                            ("values", ("metric_values", "value")))
                   if not any(n in self.columns for n in names)]
        if missing:
            raise StoreError(f"table {self.table} has columns {sorted(self.columns)}: no column for "
                             f"{', '.join(missing)}; expected the megatron_metrics layout (docs/STORES.md)")

    @property
    def own(self) -> bool:
        """The store's own layout (job and metric_values columns), which it creates."""
        return "job" in self.columns and "metric_values" in self.columns

    @property
    def distributed(self) -> bool:
        """The table is a Distributed table: rows live in a local table on each shard."""
        return self.engine == "Distributed"

    # column facts --------------------------------------------------------------------------
    def type_of(self, name: str) -> str:
        return _base_type(self.columns[name])

    @property
    def job_column(self) -> str:
        return "job" if "job" in self.columns else "job_id"

    @property
    def datetime64(self) -> bool:
        return self.type_of("timestamp").startswith("DateTime64")

    @property
    def attributes_kind(self) -> Optional[str]:
        """'json', 'object' or 'string' (attributes' type), None without the column."""
        if "attributes" not in self.columns:
            return None
        t = self.type_of("attributes")
        if t.startswith("JSON"):
            return "json"
        if t.startswith("Object"):
            return "object"
        if t == "String":
            return "string"
        raise StoreError(f"table {self.table}: attributes is {t}; expected JSON, Object('json') or String")

    def place_of(self, field: str) -> Optional[str]:
        """'column', 'attributes' or None: where `field` (rank, subname, node, cluster) lives."""
        if field in self.columns:
            return "column"
        return "attributes" if self.attributes_kind is not None else None

    # reading ------------------------------------------------------------------------------
    def ts_ms(self) -> str:
        """The row's time as ms since the epoch (UInt64 / Int64)."""
        if self.datetime64:
            return "toUnixTimestamp64Milli(timestamp)"
        return "toUInt64(timestamp) * 1000"

    def _nullable(self, name: str) -> bool:
        return self.columns[name].replace("LowCardinality(", "").startswith("Nullable(")

    def _value(self) -> str:
        """The value column as Float64, a NULL read as NaN (not measured)."""
        return "ifNull(toFloat64(value), nan)" if self._nullable("value") else "toFloat64(value)"

    def _attributes_text(self) -> str:
        kind = self.attributes_kind
        text = {"json": "toString(attributes)", "object": "toJSONString(attributes)", "string": "attributes"}[kind]
        return f"ifNull({text}, '')" if self._nullable("attributes") else text

    def field(self, name: str) -> str:
        """The expression of a Sample field (rank Int32, iteration Int64, strings, values
        Array(Float64)) over this table."""
        if name == "job":
            return self.job_column
        if name == "iteration":
            return "toInt64(iteration)"
        if name == "metric_name":
            return "metric_name"
        if name == "metric_values":
            if "metric_values" in self.columns:
                return "metric_values"
            if self.attributes_kind is None:
                return f"[{self._value()}]"
            a = self._attributes_text()
            listed = f"JSONExtract({a}, '{VALUES_KEY}', 'Array(Float64)')"
            return f"if(JSONHas({a}, '{VALUES_KEY}'), {listed}, [{self._value()}])"
        if name == "step_ms":  # the first value, for the poll's aggregate
            return "metric_values[1]" if "metric_values" in self.columns else self._value()
        if name == "ts_ms":
            return self.ts_ms()
        place = self.place_of(name)
        if place == "column":
            return f"toInt32({name})" if name == "rank" else f"toString({name})"
        if place == "attributes":
            a = self._attributes_text()
            return f"toInt32(JSONExtractInt({a}, '{name}'))" if name == "rank" else f"JSONExtractString({a}, '{name}')"
        return "toInt32(0)" if name == "rank" else "''"

    def select(self) -> str:
        """The SELECT list of FIELDS, each aliased as `_<field>` (no clash with a column)."""
        return ", ".join(f"{self.field(f)} AS _{f}" for f in FIELDS)

    def since(self, since_ms: int, seconds: int) -> str:
        """`row time >= since_ms`; the whole-second bound on the column lets the server skip
        older partitions. A table of whole seconds (DateTime) is bounded to the second: a
        row of the same second as `since` is kept, not lost to its truncation."""
        if not self.datetime64:
            return f"timestamp >= toDateTime({seconds})"
        return f"timestamp >= toDateTime({seconds}) AND {self.ts_ms()} >= {since_ms}"

    # writing ------------------------------------------------------------------------------
    def check_writable(self) -> None:
        """Raises StoreError naming the fields this table has no place for."""
        missing = [f for f in ATTRIBUTE_FIELDS if self.place_of(f) is None]
        if missing:
            raise StoreError(f"table {self.table} has no column for {', '.join(missing)} and no attributes column "
                             "to keep them in: refusing to write rows that would lose them (docs/STORES.md)")

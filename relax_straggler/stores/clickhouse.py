"""The ClickHouse store: a metrics table on a ClickHouse server, over its HTTP interface.

URL: ``clickhouse://[USER[:PASSWORD]@]HOST[:PORT][/DB][?table=NAME]`` (PORT: the HTTP
port, 8123 by default; DB: ``default``; NAME: ``megatron_metrics``). The store reads the
table's columns and engine first and uses the layout it finds
(relax_straggler.stores.clickhouse_layout): its own table, which it creates with the
database when a write finds none, or the Megatron metrics layout (``job_id``, ``value``,
``attributes``) a server may already have; either may be a Distributed table over local
tables on the shards of a cluster (reads go through it; inserts are forwarded to the
shards before the server answers). The store never creates a table on a cluster: its
DDL is the operator's (docs/STORES.md).

The client is clickhouse-connect over the HTTP interface
(relax_straggler.stores.clickhouse_client): rows travel as Arrow both ways, and every
value of a statement is a server-side query parameter (``{job:String}``) or an integer of a
validated Sample. A server too old for clickhouse-connect (Debian's 18.16) is refused at
the first call, naming the reason (docs/STORES.md).

Recovery is keyed by the server's error code: a table or database that vanished is
created again by the next write (reads find no rows meanwhile; a table of another layout
is not replaced by the store's own: writes fail naming it until it is back), columns changed behind
the store are read again, a user without the right to write gets a StoreError naming the
user and the table, and a server that is down or restarting raises StoreError after
bounded retries; the same object works again once it answers. A write returns only
once the server acknowledged every row of it.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable, Iterator, Optional, Sequence, TypeVar

import numpy as np
import pyarrow as pa

from relax_straggler.stores.base import SAMPLE_SCHEMA, STEP_METRIC, IterationTime, Sample, StoreError, samples_to_table
from relax_straggler.stores.clickhouse_client import (CHANGED_COLUMNS_CODES, MISSING_TABLE_CODES, PERMISSION_CODES,
                                                      ClickHouseClient, ClickHouseError, credentials)
from relax_straggler.common.validators import is_int
from relax_straggler.stores.clickhouse_layout import Layout, own_ddl
from relax_straggler.stores.clickhouse_rows import arrow_samples, arrow_tables, insert_table
from relax_straggler.stores.row_rules import MAX_TIMESTAMP as _MAX_TIMESTAMP, check_table
from relax_straggler.stores.url import parse_store_url, redact

log = logging.getLogger(__name__)

# An INSERT into a Distributed table returns once every shard has its rows (else the
# server queues them and answers at once: the acknowledgment would not be one). The old
# name, which servers keep as an alias of distributed_foreground_insert (23.x+).
_DISTRIBUTED_INSERT = {"insert_distributed_sync": "1"}
T = TypeVar("T")


def check_sample(i: int, s: Sample) -> None:
    """Raises ValueError naming row `i` and the field when `s` cannot be stored (the rules
    of relax_straggler.stores.row_rules, every store's, checked on one Sample)."""
    def bad(field: str, why: str, value: object) -> ValueError:
        return ValueError(f"row {i} (job {s.job!r}, {s.metric_name!r}, rank {s.rank!r}, iteration {s.iteration!r}): "
                          f"{field} {why}, got {value!r}")

    for field in ("job", "metric_name"):
        value = getattr(s, field)
        if not isinstance(value, str) or not value:
            raise bad(field, "must be a non-empty string", value)
    for field in ("subname", "node", "cluster"):
        if not isinstance(getattr(s, field), str):
            raise bad(field, "must be a string", getattr(s, field))
    if not is_int(s.rank, numpy=True) or not 0 <= s.rank < 2**31:
        raise bad("rank", "must be an integer in [0, 2^31)", s.rank)
    if not is_int(s.iteration, numpy=True) or not 0 <= s.iteration < 2**63:
        raise bad("iteration", "must be an integer >= 0", s.iteration)
    if not _is_number(s.timestamp) or not 0 <= s.timestamp <= _MAX_TIMESTAMP:
        raise bad("timestamp", "must be a finite time in s since the epoch, before 2106", s.timestamp)
    if not isinstance(s.values, (tuple, list)) or not s.values:
        raise bad("values", "must be a non-empty sequence of ms", s.values)
    for v in s.values:
        if not _is_number(v):
            raise bad("values", "must be finite numbers (ms)", s.values)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_)) \
        and math.isfinite(x)


class ClickHouseStore:
    """The Store protocol (relax_straggler.stores.base) on a ClickHouse server.

    url: ``clickhouse://[USER[:PASSWORD]@]HOST[:PORT][/DB][?table=NAME]``; raises
    ValueError for a bad URL (naming the part, e.g. the table parameter). Nothing is sent
    until the first call. timeout_s: per request (connect and each read), s; retries,
    backoff_s: of requests that can be repeated (clickhouse_client): short, for a blip (a
    refused connect during a restart, a transient server code); the sink, ingest and the
    monitor retry longer on their own. Thread-safe.
    """

    def __init__(self, url: str, timeout_s: float = 30.0, retries: int = 1, backoff_s: float = 0.05) -> None:
        parsed = parse_store_url(url)
        if parsed.scheme != "clickhouse":
            raise ValueError(f"store URL {url!r}: ClickHouseStore needs clickhouse://HOST:PORT/DB")
        self.url = url
        self.database, self.table_name = parsed.database, parsed.table
        self._table = f"`{parsed.database}`.`{parsed.table}`"
        self._name = redact(url)
        user, password = credentials(url)
        self._client = ClickHouseClient(parsed.location, parsed.port, self._name, user, password,
                                        timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        self._layout: Optional[Layout] = None  # the table's columns as last read; None: not read or absent
        self._lost: Optional[Layout] = None  # a table of another layout that vanished: not created again
        self._lock = threading.Lock()

    # Store protocol ---------------------------------------------------------------------
    def write(self, samples: Sequence[Sample]) -> None:
        """Inserts `samples` in one INSERT (one request; ClickHouse applies a block of up
        to ~1M rows atomically). Returns once the server acknowledged it. Raises
        ValueError naming the first malformed row (nothing is written then), StoreError
        when the server is unreachable or refuses (a user without the right to write:
        naming user and table)."""
        for i, s in enumerate(samples):
            check_sample(i, s)
        if samples:
            self.write_table(samples_to_table(samples))

    def write_table(self, table: pa.Table) -> None:
        """Inserts the rows of a SAMPLE_SCHEMA table, as write(); the insert is built column
        by column in Arrow. Raises ValueError for missing or mistyped columns and names
        the first bad row; StoreError as write()."""
        missing = [f.name for f in SAMPLE_SCHEMA if f.name not in table.column_names]
        if missing:
            raise ValueError(f"write_table: missing column(s) {missing}; expected {SAMPLE_SCHEMA.names}")
        try:
            table = table.select(SAMPLE_SCHEMA.names).cast(SAMPLE_SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ValueError(f"write_table: columns do not match {SAMPLE_SCHEMA}: {exc}") from None
        if table.num_rows == 0:
            return
        check_table(table)

        def insert() -> None:
            layout = self._writable_layout()
            settings = _DISTRIBUTED_INSERT if layout.distributed else None
            self._client.insert(self._table, insert_table(table, layout), settings, check_count=not layout.distributed)

        self._recovering(insert, "write to", create=True)

    def iterations(self, job: str, after_iteration: int = -1, since: float = 0.0) -> list[IterationTime]:
        """One aggregate over the interval-time rows of `job` after `after_iteration` (the
        table's sort key starts with job, metric_name: only those rows are read). A table
        that does not exist has no iterations."""
        def read() -> list[IterationTime]:
            layout = self._read_layout()
            if layout is None:
                return []
            rows = self._client.rows(
                f"SELECT toInt64(iteration) AS _it, max({layout.field('step_ms')}), max({layout.ts_ms()}), "
                f"uniqExact({layout.field('rank')}) FROM {self._table} "
                f"WHERE {layout.job_column} = {{job:String}} AND metric_name = {{metric:String}} "
                f"AND iteration > {int(after_iteration)} AND {self._since(layout, since)} "
                "GROUP BY _it ORDER BY _it", {"job": job, "metric": STEP_METRIC})
            return [IterationTime(int(it), float(step_ms), int(last_ms) / 1000.0, int(ranks))
                    for it, step_ms, last_ms, ranks in rows]

        return self._recovering(read, "read", empty=[])

    def samples(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[Sample]:
        """Streams the rows (the answer is decoded as it arrives, never held whole), one
        Sample per row. Raises StoreError when the request fails, also part way through."""
        return self._rows(job, first_iteration, last_iteration, since, arrow_samples)

    def tables(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[pa.Table]:
        """The rows of samples() as SAMPLE_SCHEMA tables, streamed: one per Arrow record
        batch of the answer, built column by column (a table may end inside an iteration).
        Raises as samples()."""
        return self._rows(job, first_iteration, last_iteration, since, arrow_tables)

    def table(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> pa.Table:
        """samples() as one SAMPLE_SCHEMA table (the whole range in memory). Raises as samples()."""
        parts = list(self.tables(job, first_iteration, last_iteration, since))
        return pa.concat_tables(parts) if parts else SAMPLE_SCHEMA.empty_table()

    def _rows(self, job: str, first_iteration: int, last_iteration: int, since: float,
              decode: Callable[[Iterator[pa.RecordBatch]], Iterator[T]]) -> Iterator[T]:
        """The range's rows, decoded by `decode` from the answer's Arrow record batches as
        they arrive, ordered by iteration, rank, timer."""
        for attempt in (0, 1):
            layout = self._recovering(self._read_layout, "read", empty=None)
            if layout is None:
                return
            query = (f"SELECT {layout.select()} FROM {self._table} WHERE {layout.job_column} = {{job:String}} "
                     f"AND iteration >= {int(first_iteration)} AND iteration <= {int(last_iteration)} "
                     f"AND {self._since(layout, since)} ORDER BY _iteration, _rank, _metric_name, _subname")
            try:
                with self._client.batches(query, {"job": job}) as batches:
                    yield from decode(batches)
                return
            except ClickHouseError as exc:
                if exc.code in MISSING_TABLE_CODES:
                    if not self._check_gone(exc) or attempt == 1:
                        return
                    continue  # created again meanwhile: read it
                if exc.code not in CHANGED_COLUMNS_CODES or attempt == 1:
                    raise self._permission(exc, "read") from None
                self._layout = None  # read the columns again, once

    def jobs(self, since: float = 0.0) -> list[str]:
        def read() -> list[str]:
            layout = self._read_layout()
            if layout is None:
                return []
            rows = self._client.rows(f"SELECT DISTINCT {layout.job_column} FROM {self._table} "
                                     f"WHERE {self._since(layout, since)} ORDER BY {layout.job_column}")
            return [job for (job,) in rows]

        return self._recovering(read, "read", empty=[])

    def job_problems(self, job: str) -> list[str]:
        """[]: the server keeps its own data whole (a damaged part is the server's to report)."""
        return []

    def ping(self) -> None:
        self._client.ping()

    def close(self) -> None:
        self._client.close()

    def layout(self) -> Optional[Layout]:
        """The table's layout as the server has it now; None when the table does not exist.
        Raises StoreError as the reads do."""
        with self._lock:
            self._layout = None
        return self._recovering(self._read_layout, "read", empty=None)

    def __repr__(self) -> str:
        return f"ClickHouseStore({self._name!r})"

    # internals ---------------------------------------------------------------------------
    def _recovering(self, call: Callable[[], T], action: str, create: bool = False, empty: object = None) -> T:
        """call(), recovering by error code: a missing table or database is created again
        and call() repeated once (create) or answers `empty` (reads; repeated once when
        another writer created it again meanwhile); changed columns are read again and
        call() repeated once; a permission error names the user."""
        for attempt in (0, 1):
            try:
                return call()
            except ClickHouseError as exc:
                if exc.code in MISSING_TABLE_CODES:
                    back = self._check_gone(exc)
                    if not create and not back:
                        return empty  # type: ignore[return-value]
                elif exc.code not in CHANGED_COLUMNS_CODES:
                    raise self._permission(exc, action) from None
                else:
                    self._layout = None
                if attempt == 1:
                    raise
                log.info("%s; reading the table's columns again", exc)
        raise AssertionError("unreachable")

    def _check_gone(self, exc: ClickHouseError) -> bool:
        """After a missing-table code: False when the store's table is gone (a read then
        answers no rows, a write creates it), True when a plain table of that name exists
        again (another writer created it meanwhile: repeat the call). Raises StoreError
        when a Distributed table is still there: a table it reads from is missing (the
        local table under it, on this server or a shard), which the store must not create
        in its place."""
        previous, self._layout = self._layout, None
        layout = self._read_layout()
        if layout is None and previous is not None and not previous.own:
            self._lost = previous
        if layout is not None and not layout.distributed:
            return True
        if layout is not None:
            raise StoreError(f"{self._name}: {self._table} exists but a table it reads is missing (the table under "
                             "this Distributed table, on this server or a shard); create it ON CLUSTER "
                             f"(docs/STORES.md) (server code {exc.code}: {str(exc).split(': ', 2)[-1]})")
        return False

    def _permission(self, exc: ClickHouseError, action: str) -> StoreError:
        if exc.code not in PERMISSION_CODES:
            return exc
        return ClickHouseError(f"{self._name}: user {self._client.user!r} may not {action} {self._table} "
                               f"(server code {exc.code}: {str(exc).split(': ', 2)[-1]})", exc.code)

    def _read_layout(self) -> Optional[Layout]:
        """The table's columns (system.columns), read once; None while the table is absent."""
        if self._layout is not None:
            return self._layout
        names = {"db": self.database, "table": self.table_name}
        columns = dict(self._client.rows("SELECT name, type FROM system.columns WHERE database = {db:String} "
                                         "AND table = {table:String} ORDER BY position", names))
        if not columns:
            return None
        engine = self._client.rows("SELECT engine FROM system.tables WHERE database = {db:String} "
                                   "AND name = {table:String}", names)
        self._layout = Layout(self._table, columns, engine[0][0] if engine else "")
        return self._layout

    def _writable_layout(self) -> Layout:
        layout = self._read_layout()
        if layout is None and self._lost is not None:
            raise StoreError(f"{self._name}: {self._table} (columns {', '.join(self._lost.columns)}) is gone; the "
                             "store does not create it again in its own layout, which the table's other writers "
                             "could not write: create it again as it was (docs/STORES.md)")
        if layout is not None:
            self._lost = None
        if layout is None:
            self._client.command(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")
            self._client.command(own_ddl(self._table))
            layout = self._read_layout()
            if layout is None:
                raise StoreError(f"{self._name}: {self._table} was created but system.columns does not list it")
        try:
            layout.check_writable()
        except StoreError:  # columns as read before: they may have been added since
            self._layout = None
            layout = self._read_layout()
            if layout is None:
                return self._writable_layout()
            layout.check_writable()
        return layout

    @staticmethod
    def _since(layout: Layout, since: float) -> str:
        """The `timestamp >= since` condition, to the ms (rows are stored rounded to the ms,
        and so is since)."""
        if not _is_number(since):
            raise ValueError(f"since must be a finite time in s since the epoch, got {since!r}")
        if since <= 0:
            return "1"
        since_ms = int(round(since * 1000.0))
        return layout.since(since_ms, min(since_ms // 1000, _MAX_TIMESTAMP))

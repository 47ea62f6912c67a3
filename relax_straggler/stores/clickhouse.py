"""The ClickHouse store: the ``megatron_metrics`` table on a ClickHouse server, over its HTTP
interface (``clickhouse://HOST:PORT/DB``, PORT being the HTTP port, 8123 by default).

Table (created with the database if absent):

    timestamp     DateTime   s since the epoch (whole seconds)
    timestamp_ms  UInt16     the milliseconds of timestamp (0..999)
    job, metric_name, subname, node, cluster  String
    rank          Int32
    iteration     Int64
    metric_values Array(Float64)   ms
    ENGINE = MergeTree PARTITION BY toYYYYMMDD(timestamp) ORDER BY (job, metric_name, rank, iteration)

The mt-detector layout has ``timestamp DateTime64(3)``; DateTime64 only exists from ClickHouse 20.1
and the Debian server is 18.16, so the milliseconds are a column of their own.

Why plain HTTP (httpx) and not clickhouse-connect: clickhouse-connect reads server settings
on connect with columns 18.16 does not have ("Unknown identifier: readonly") and cannot talk
to it at all. 18.16 has no query parameters either, so string literals are escaped here
(``quote``), and every value comes from a typed, validated Sample.

Rows travel as TabSeparated. Each call is one HTTP request on a pooled connection; a
request that fails (server down, restarting) raises StoreError and the next call opens a
new connection, so the same object works again once the server is back.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Iterator, Optional, Sequence

import httpx
import pyarrow as pa
import pyarrow.compute as pc

from relax_straggler.stores.base import SAMPLE_SCHEMA, STEP_METRIC, IterationTime, Sample, StoreError, samples_to_table
from relax_straggler.stores.url import parse_store_url

log = logging.getLogger(__name__)

TABLE = "megatron_metrics"
# ClickHouse error codes after which the table is created again and the request retried
# once: UNKNOWN_TABLE (60), UNKNOWN_DATABASE (81) (a server that lost its data directory).
_MISSING_TABLE_CODES = ("code 60:", "code 81:")
_CODE = re.compile(r"Code: (\d+), e\.displayText\(\) = (?:DB::Exception: )?(.*?)(?:, e\.what\(\) = .*)?$", re.S)
_MAX_TIMESTAMP = 2**32 - 1  # DateTime is a UInt32

# TabSeparated escapes, backslash first (ClickHouse reads these back).
_TSV_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r"), ("\0", "\\0"))
_TSV_UNESCAPES = {"t": "\t", "n": "\n", "r": "\r", "0": "\0", "b": "\b", "f": "\f", "\\": "\\", "'": "'"}
_TSV_UNESCAPE = re.compile(r"\\(.)", re.S)

COLUMNS = ("timestamp", "timestamp_ms", "job", "metric_name", "subname", "rank", "iteration", "node", "cluster",
           "metric_values")


def quote(text: str) -> str:
    """text as a ClickHouse string literal: backslash and quote escaped, so no value can
    end the literal (18.16 has no query parameters)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _untsv(field: str) -> str:
    return _TSV_UNESCAPE.sub(lambda m: _TSV_UNESCAPES.get(m.group(1), m.group(1)), field) if "\\" in field else field


def check_sample(i: int, s: Sample) -> None:
    """Raises ValueError naming row `i` and the field when `s` cannot be stored: job and
    metric_name non-empty strings; subname, node, cluster strings; rank in [0, 2^31);
    iteration >= 0; timestamp finite in [0, 2^32) s; values a non-empty sequence of finite
    numbers (ms)."""
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
    if not _is_int(s.rank) or not 0 <= s.rank < 2**31:
        raise bad("rank", "must be an integer in [0, 2^31)", s.rank)
    if not _is_int(s.iteration) or not 0 <= s.iteration < 2**63:
        raise bad("iteration", "must be an integer >= 0", s.iteration)
    if not _is_number(s.timestamp) or not 0 <= s.timestamp <= _MAX_TIMESTAMP:
        raise bad("timestamp", "must be a finite time in s since the epoch, before 2106", s.timestamp)
    if not isinstance(s.values, (tuple, list)) or not s.values:
        raise bad("values", "must be a non-empty sequence of ms", s.values)
    for v in s.values:
        if not _is_number(v):
            raise bad("values", "must be finite numbers (ms)", s.values)


def check_table(table: pa.Table) -> None:
    """check_sample's rules over a SAMPLE_SCHEMA table, vectorized (nulls are bad values).
    Raises ValueError naming the first bad row and field."""
    values = table.column("metric_values")
    ts = table.column("timestamp")
    flat = pc.list_flatten(values)
    bad_value_rows = pc.list_parent_indices(values).filter(pc.invert(pc.is_finite(flat)).fill_null(True))

    def empty(name: str) -> pa.ChunkedArray:
        return pc.fill_null(pc.equal(pc.utf8_length(table.column(name)), 0), True)

    checks = [
        ("job", "must be a non-empty string", empty("job")),
        ("metric_name", "must be a non-empty string", empty("metric_name")),
        ("rank", "must be an integer in [0, 2^31)", pc.fill_null(pc.less(table.column("rank"), 0), True)),
        ("iteration", "must be an integer >= 0", pc.fill_null(pc.less(table.column("iteration"), 0), True)),
        ("timestamp", "must be a finite time in s since the epoch, before 2106",
         pc.fill_null(pc.invert(pc.and_(pc.is_finite(ts), pc.and_(pc.greater_equal(ts, 0),
                                                                  pc.less_equal(ts, _MAX_TIMESTAMP)))), True)),
        ("metric_values", "must be a non-empty list of ms", pc.fill_null(pc.equal(pc.list_value_length(values), 0),
                                                                         True)),
    ]
    checks += [(name, "must be a string", pc.is_null(table.column(name))) for name in ("subname", "node", "cluster")]
    if len(bad_value_rows):
        checks.append(("metric_values", "must be finite numbers (ms)",
                       pc.is_in(pa.array(range(table.num_rows)), value_set=bad_value_rows)))
    for name, why, bad in checks:
        hits = pc.indices_nonzero(bad)
        if len(hits):
            i = hits[0].as_py()
            raise ValueError(f"row {i} (job {table.column('job')[i].as_py()!r}, rank {table.column('rank')[i].as_py()}, "
                             f"iteration {table.column('iteration')[i].as_py()}): {name} {why}, "
                             f"got {table.column(name)[i].as_py()!r}")


def _tsv_body(table: pa.Table) -> bytes:
    """The TabSeparated rows of a checked SAMPLE_SCHEMA table, in COLUMNS order."""
    total_ms = pc.cast(pc.round(pc.multiply(table.column("timestamp"), 1000.0)), pa.int64())
    seconds = pc.divide(total_ms, 1000)  # integer division: timestamps are >= 0
    ms = pc.subtract(total_ms, pc.multiply(seconds, 1000))

    def text(name: str) -> pa.ChunkedArray:
        col = table.column(name)
        for raw, escaped in _TSV_ESCAPES:
            col = pc.replace_substring(col, raw, escaped)
        return col

    # Arrow prints float64 in the shortest form that reads back exactly.
    values = pc.binary_join(pc.cast(table.column("metric_values"), pa.list_(pa.string())), ",")
    columns = [seconds, ms, text("job"), text("metric_name"), text("subname"), table.column("rank"),
               table.column("iteration"), text("node"), text("cluster"),
               pc.binary_join_element_wise("[", values, "]", "")]
    lines = pc.binary_join_element_wise(*[pc.cast(c, pa.string()) for c in columns], "\t").combine_chunks()
    one = pa.ListArray.from_arrays(pa.array([0, len(lines)], pa.int32()), lines)
    return pc.binary_join(one, "\n")[0].as_buffer().to_pybytes() + b"\n"


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _error_message(text: str) -> str:
    """The useful part of a ClickHouse error body ('Code: 62, e.displayText() = ...')."""
    m = _CODE.search(text.strip())
    return f"code {m.group(1)}: {m.group(2).strip()}" if m else text.strip()[:500]


class ClickHouseStore:
    """The Store protocol (relax_straggler.stores.base) on a ClickHouse server.

    url: ``clickhouse://HOST[:PORT][/DB]`` (PORT: HTTP port, default 8123; DB default
    'default'; a database name is letters, digits and '_'). Raises ValueError for a bad
    URL. Nothing is sent until the first call; the database and table are created then.
    timeout_s: per request (connect and each read). Thread-safe (httpx.Client is).
    """

    def __init__(self, url: str, timeout_s: float = 30.0) -> None:
        parsed = parse_store_url(url)
        if parsed.scheme != "clickhouse":
            raise ValueError(f"store URL {url!r}: ClickHouseStore needs clickhouse://HOST:PORT/DB")
        self.url = url
        self.database = parsed.database
        self._table = f"`{parsed.database}`.`{TABLE}`"
        self._http = httpx.Client(base_url=f"http://{parsed.location}:{parsed.port}", timeout=timeout_s)
        self._ready = False  # the table is known to exist

    # Store protocol ---------------------------------------------------------------------
    def write(self, samples: Sequence[Sample]) -> None:
        """Inserts `samples` in one INSERT (one request; ClickHouse applies a block of up
        to ~1M rows atomically). Raises ValueError naming the first malformed row (nothing
        is written then), StoreError when the server is unreachable or refuses."""
        for i, s in enumerate(samples):
            check_sample(i, s)
        if samples:
            self.write_table(samples_to_table(samples))

    def write_table(self, table: pa.Table) -> None:
        """Inserts the rows of a SAMPLE_SCHEMA table, as write(). The TabSeparated body is
        built column by column in Arrow (no Python object per row). Raises ValueError for
        missing or mistyped columns and names the first bad row; StoreError as write()."""
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
        self._request(f"INSERT INTO {self._table} ({', '.join(COLUMNS)}) FORMAT TabSeparated", _tsv_body(table))

    def iterations(self, job: str, after_iteration: int = -1, since: float = 0.0) -> list[IterationTime]:
        """One aggregate over the interval-time rows of `job` after `after_iteration` (the
        table's sort key starts with job, metric_name: only those rows are read)."""
        text = self._request(
            f"SELECT iteration, max(metric_values[1]), max(toUInt64(timestamp) * 1000 + timestamp_ms), "
            f"uniqExact(rank) FROM {self._table} WHERE job = {quote(job)} AND metric_name = {quote(STEP_METRIC)} "
            f"AND iteration > {int(after_iteration)} AND {self._since(since)} "
            f"GROUP BY iteration ORDER BY iteration FORMAT TabSeparated")
        out = []
        for line in text.splitlines():
            it, step_ms, last_ms, ranks = line.split("\t")
            out.append(IterationTime(int(it), float(step_ms), int(last_ms) / 1000.0, int(ranks)))
        return out

    def samples(self, job: str, first_iteration: int, last_iteration: int, since: float = 0.0) -> Iterator[Sample]:
        """Streams the rows (the response is read line by line, never held whole).
        Raises StoreError when the request fails, also part way through."""
        self._ensure_table()
        query = (f"SELECT toUInt32(timestamp), {', '.join(COLUMNS[1:])} FROM {self._table} WHERE job = {quote(job)} "
                 f"AND iteration >= {int(first_iteration)} AND iteration <= {int(last_iteration)} "
                 f"AND {self._since(since)} ORDER BY iteration, rank, metric_name, subname FORMAT TabSeparated")
        try:
            with self._http.stream("POST", "/", content=query.encode("utf-8")) as response:
                if response.status_code != 200:
                    raise StoreError(f"{self.url}: {_error_message(response.read().decode('utf-8', 'replace'))}")
                for line in response.iter_lines():
                    if line:
                        yield _parse_row(line)
        except httpx.HTTPError as exc:
            raise StoreError(f"{self.url}: {type(exc).__name__}: {exc}") from None

    def jobs(self, since: float = 0.0) -> list[str]:
        text = self._request(f"SELECT DISTINCT job FROM {self._table} WHERE {self._since(since)} ORDER BY job "
                             "FORMAT TabSeparated")
        return [_untsv(line) for line in text.split("\n") if line]

    def ping(self) -> None:
        try:
            response = self._http.get("/ping")
        except httpx.HTTPError as exc:
            raise StoreError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise StoreError(f"{self.url}: /ping answered HTTP {response.status_code}")

    def close(self) -> None:
        self._http.close()

    def __repr__(self) -> str:
        return f"ClickHouseStore({self.url!r})"

    # internals ---------------------------------------------------------------------------
    @staticmethod
    def _since(since: float) -> str:
        """The `timestamp >= since` condition, to the ms (rows are stored rounded to the ms,
        and so is since). The whole-second bound lets ClickHouse skip older partitions."""
        if not _is_number(since):
            raise ValueError(f"since must be a finite time in s since the epoch, got {since!r}")
        if since <= 0:
            return "1"
        since_ms = int(round(since * 1000.0))
        return (f"timestamp >= toDateTime({min(since_ms // 1000, _MAX_TIMESTAMP)}) AND "
                f"toUInt64(timestamp) * 1000 + timestamp_ms >= {since_ms}")

    def _ensure_table(self) -> None:
        if self._ready:
            return
        self._post(f"CREATE DATABASE IF NOT EXISTS `{self.database}`")
        self._post(f"CREATE TABLE IF NOT EXISTS {self._table} (timestamp DateTime, timestamp_ms UInt16, job String, "
                   "metric_name String, subname String, rank Int32, iteration Int64, node String, cluster String, "
                   "metric_values Array(Float64)) ENGINE = MergeTree PARTITION BY toYYYYMMDD(timestamp) "
                   "ORDER BY (job, metric_name, rank, iteration)")
        self._ready = True

    def _request(self, query: str, body: Optional[bytes] = None) -> str:
        """Runs `query` (with `body` as INSERT data) after making sure the table exists; a
        table that vanished (the server lost its data) is created again, once."""
        self._ensure_table()
        try:
            return self._post(query, body)
        except StoreError as exc:
            if not any(code in str(exc) for code in _MISSING_TABLE_CODES):
                raise
            self._ready = False
            self._ensure_table()
            return self._post(query, body)

    def _post(self, query: str, body: Optional[bytes] = None) -> str:
        try:
            if body is None:
                response = self._http.post("/", content=query.encode("utf-8"))
            else:
                response = self._http.post("/", params={"query": query}, content=body)
        except httpx.HTTPError as exc:
            raise StoreError(f"{self.url}: {type(exc).__name__}: {exc}") from None
        if response.status_code != 200:
            raise StoreError(f"{self.url}: {_error_message(response.text)}")
        return response.text


def _parse_row(line: str) -> Sample:
    (seconds, ms, job, metric, subname, rank, iteration, node, cluster, values) = line.split("\t")
    inner = values[1:-1]
    return Sample(timestamp=int(seconds) + int(ms) / 1000.0, job=_untsv(job), metric_name=_untsv(metric),
                  rank=int(rank), iteration=int(iteration),
                  values=tuple(float(v) for v in inner.split(",")) if inner else (),
                  subname=_untsv(subname), node=_untsv(node), cluster=_untsv(cluster))

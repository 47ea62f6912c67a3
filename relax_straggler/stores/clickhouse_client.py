"""ClickHouse's HTTP interface through clickhouse-connect, errors keyed by their numeric code.

clickhouse-connect (the official client) does the HTTP, the Arrow encoding of inserts and
answers, the server-side query parameters and the typed error codes; this module adds the
store's policy on top. Inserts are Arrow with LZ4-compressed buffers and answers may come
LZ4-compressed: a 1M-row insert is 1.5x as fast as uncompressed on a local server
(docs/PERFORMANCE.md). Every recovery decision of the ClickHouse store is taken on
``ClickHouseError.code``, the server's error code (``X-ClickHouse-Exception-Code``).

Retries are bounded and back off: a request that never reached the server (connection
refused, connect timeout) and one the server refused as transient (too many queries or
parts) is sent again; a read also after the connection broke mid-way. An INSERT whose
connection broke after it was sent is not repeated (the server may have applied it): it
raises StoreError saying so, and the caller decides.

clickhouse-connect reads ``system.settings`` columns when it connects that old servers lack
(Debian's 18.16 answers ``Code: 47 ... Unknown identifier: readonly``); such a server is
refused at the first call with a StoreError saying so.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional, TypeVar
from urllib.parse import unquote, urlsplit

import pyarrow as pa

from relax_straggler.stores.base import StoreError

# Error codes (ClickHouse's src/Common/ErrorCodes.cpp); the names are those servers print.
NO_SUCH_COLUMN_IN_TABLE = 16
ILLEGAL_TYPE_OF_ARGUMENT = 43
UNKNOWN_IDENTIFIER = 47
TYPE_MISMATCH = 53
UNKNOWN_TABLE = 60
UNKNOWN_DATABASE = 81
READONLY = 164
ACCESS_DENIED = 497
UNKNOWN_USER = 192
WRONG_PASSWORD = 193
AUTHENTICATION_FAILED = 516
# The table or database is gone: the writer creates it again.
MISSING_TABLE_CODES = frozenset({UNKNOWN_TABLE, UNKNOWN_DATABASE})
# The table's columns are not what the store read (gone, or of another type): it reads them again.
CHANGED_COLUMNS_CODES = frozenset({NO_SUCH_COLUMN_IN_TABLE, ILLEGAL_TYPE_OF_ARGUMENT, UNKNOWN_IDENTIFIER, TYPE_MISMATCH})
# The user may not do this: retrying cannot help.
PERMISSION_CODES = frozenset({READONLY, ACCESS_DENIED, UNKNOWN_USER, WRONG_PASSWORD, AUTHENTICATION_FAILED})
# Refused for now: TIMEOUT_EXCEEDED, TOO_MANY_SIMULTANEOUS_QUERIES, SOCKET_TIMEOUT,
# NETWORK_ERROR, TOO_MANY_PARTS, TABLE_IS_READ_ONLY (a replica without its keeper).
TRANSIENT_CODES = frozenset({159, 202, 209, 210, 252, 242})
# An insert returns only after the server applied every row (the status follows the insert).
_ACKNOWLEDGED = {"wait_end_of_query": "1"}
T = TypeVar("T")
# "Code: 60. DB::Exception: " before, " (version 26.9.2.1)" after the server's own words.
_SERVER_FRAMING = re.compile(r"^Code: \d+[.,] (?:e\.displayText\(\) = )?(?:DB::Exception: )?|\s*\(version [^)]*\)\s*$")
_CALLING = threading.local()  # depth of ClickHouseClient calls on this thread


class _OwnRequests(logging.Filter):
    """Drops the records clickhouse-connect and urllib3 log for each failed request of the
    store (a traceback, a retry with the whole query in its URL): the store's callers report
    failures themselves, rate-limited (the sink: one line per log_every_s). Records of
    other code pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(_CALLING, "depth", 0) or record.levelno >= logging.ERROR


for _name in ("clickhouse_connect.driver._backend.http_sync", "urllib3.connectionpool"):
    logging.getLogger(_name).addFilter(_OwnRequests())


class ClickHouseError(StoreError):
    """The server refused a statement. code: ClickHouse's error code (0 when the answer
    carried none, e.g. a proxy's page); str(): the store, the code and the server's text."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code

    @property
    def permanent(self) -> bool:
        """The user may not do this: repeating the request cannot help."""
        return self.code in PERMISSION_CODES


def credentials(url: str) -> tuple[Optional[str], str]:
    """(user, password) of a clickhouse://USER[:PASSWORD]@HOST URL; (None, '') without."""
    parts = urlsplit(url)
    if parts.username is None:
        return None, ""
    return unquote(parts.username), unquote(parts.password or "")


class ClickHouseClient:
    """Statements to the server at host:port as `user` (None: the server's default user).

    Nothing is sent before the first call (clickhouse-connect connects on creation, so the
    client is made then, and made again after a call found the server unreachable).
    timeout_s: connect and each read, s; retries: extra attempts of a request that can be
    repeated (see the module docstring), waiting backoff_s, doubling. Thread-safe
    (clickhouse-connect's HTTP client is, without a session id).
    """

    def __init__(self, host: str, port: int, name: str, user: Optional[str] = None, password: str = "",
                 timeout_s: float = 30.0, retries: int = 1, backoff_s: float = 0.05) -> None:
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries must be >= 0 and backoff_s >= 0, got {retries}, {backoff_s}")
        self.name = name  # the store, as messages name it
        self.user = user or "default"
        self._host, self._port, self._password = host, port, password
        self._timeout_s = max(1, int(round(timeout_s)))
        self._retries, self._backoff_s = retries, backoff_s
        self._client: Any = None
        self._lock = threading.Lock()

    # statements --------------------------------------------------------------------------
    def command(self, sql: str, parameters: Optional[Mapping[str, Any]] = None) -> None:
        """Runs a statement without an answer (DDL). Raises ClickHouseError when the
        server refuses, StoreError when it cannot be reached after the retries."""
        self._call(lambda c: c.command(sql, parameters=parameters), can_repeat=True)

    def rows(self, sql: str, parameters: Optional[Mapping[str, Any]] = None) -> list[tuple]:
        """The rows of a small SELECT ({name:Type} placeholders filled from `parameters`
        by the server). Raises as command()."""
        return self._call(lambda c: c.query(sql, parameters=parameters).result_rows, can_repeat=True)

    @contextmanager
    def batches(self, sql: str, parameters: Optional[Mapping[str, Any]] = None) -> Iterator[Iterator[pa.RecordBatch]]:
        """The answer of a SELECT as Arrow record batches (strings as Arrow strings), read as
        they arrive, never held whole. Raises as command(); a connection that breaks part
        way, or an error the server sends after its first batch, raises StoreError."""
        stream = self._call(lambda c: c.query_arrow_stream(sql, parameters=parameters, use_strings=True),
                            can_repeat=True)
        with stream:
            yield self._guarded(stream)

    def insert(self, table: str, rows: pa.Table, settings: Optional[Mapping[str, str]] = None,
               check_count: bool = True) -> None:
        """Inserts `rows` into `table` (quoted, with its database) as Arrow in one request;
        returns once the server acknowledged them. settings: server settings of this insert.
        check_count: the server's summary must count at least every row (a table whose
        writes go elsewhere, a Distributed one, counts the rows of each hop, or none).
        Raises ClickHouseError when refused, StoreError when unreachable, when the
        connection broke after the insert was sent (it may have been applied), or when the
        server counts fewer rows written than were sent."""
        def insert(c: Any) -> Any:
            return c.insert_arrow(table, rows, settings={**(settings or {}), **_ACKNOWLEDGED})

        summary = self._call(insert, can_repeat=False)
        written = getattr(summary, "written_rows", None)
        if check_count and written is not None and written < rows.num_rows:
            raise StoreError(f"{self.name}: the server wrote {written} of the {rows.num_rows} rows of an insert "
                             f"into {table}")

    def ping(self) -> None:
        """Returns when the server answers /ping; raises StoreError otherwise (no retry)."""
        client = self._connected()
        if not client.ping():
            raise StoreError(f"{self.name}: the server does not answer /ping")

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    # internals ----------------------------------------------------------------------------
    def _connected(self) -> Any:
        with self._lock:
            if self._client is not None:
                return self._client
        import clickhouse_connect
        from clickhouse_connect.driver.exceptions import Error as DriverError

        try:
            client = clickhouse_connect.get_client(
                host=self._host, port=self._port, username=self.user, password=self._password,
                connect_timeout=self._timeout_s, send_receive_timeout=self._timeout_s, query_retries=0,
                autogenerate_session_id=False, compress="lz4")
        except DriverError as exc:
            if _code(exc) is None:
                raise _Unreached(f"{self.name}: cannot connect: {_text(exc)}") from None
            if _code(exc) == UNKNOWN_IDENTIFIER:
                raise StoreError(f"{self.name}: the server is too old for clickhouse-connect, the store's client "
                                 f"(its system.settings lacks columns: {_text(exc)}); use a server of the last few "
                                 "years (the store is tested on ClickHouse 26.9; docs/STORES.md)") from None
            raise _Refused(self._server_error(exc)) from None
        with self._lock:
            if self._client is None:
                self._client = client
                return client
        client.close()
        return self._client

    def _call(self, call: Callable[[Any], T], can_repeat: bool) -> T:
        _CALLING.depth = getattr(_CALLING, "depth", 0) + 1
        try:
            return self._attempts(call, can_repeat)
        finally:
            _CALLING.depth -= 1

    def _attempts(self, call: Callable[[Any], T], can_repeat: bool) -> T:
        from clickhouse_connect.driver.exceptions import Error as DriverError

        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                return call(self._connected())
            except _Unreached as exc:
                if last:
                    raise StoreError(str(exc)) from None
            except _Refused as exc:  # the server's answer to the connect's own queries
                if exc.error.code not in TRANSIENT_CODES or last:
                    raise exc.error from None
            except DriverError as exc:
                if _code(exc) is not None:  # the server's answer
                    error = self._server_error(exc)
                    if error.code not in TRANSIENT_CODES or last:
                        raise error from None
                elif not can_repeat and not _never_sent(exc):  # transport: refused, reset, timed out
                    raise StoreError(f"{self.name}: {_text(exc)}; the insert may or may not have been applied") from None
                elif last:
                    raise StoreError(f"{self.name}: {_text(exc)}") from None
            time.sleep(self._backoff_s * 2**attempt)
        raise AssertionError("unreachable")

    def _guarded(self, stream: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from clickhouse_connect.driver.exceptions import ClickHouseError as DriverError
        from urllib3.exceptions import HTTPError

        try:
            yield from stream
        except (DriverError, HTTPError, pa.ArrowInvalid, OSError) as exc:
            raise StoreError(f"{self.name}: the answer broke off: {_text(exc)}") from None

    def _server_error(self, exc: Exception) -> ClickHouseError:
        code = _code(exc) or 0
        return ClickHouseError(f"{self.name}: code {code}: {_text(exc)}", code)


class _Unreached(StoreError):
    """No connection could be made: nothing was sent."""


class _Refused(StoreError):
    """The server refused one of the queries clickhouse-connect makes when it connects."""

    def __init__(self, error: ClickHouseError) -> None:
        super().__init__(str(error))
        self.error = error


def _code(exc: Exception) -> Optional[int]:
    """The server's error code of a clickhouse-connect error; None for a transport error."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, int) else None


def _text(exc: BaseException) -> str:
    """The server's message without clickhouse-connect's framing, or the transport error
    that caused a failure (the connection's, not the request URL's), <= 500 chars."""
    if _code(exc) is None:
        root = _transport_cause(exc)
        if root is not None:
            return f"{type(root).__name__}: {root}"[:500]
    text = str(exc).split("server response: ", 1)[-1]
    text = _SERVER_FRAMING.sub("", text.split(" (for url ", 1)[0].strip())
    return text[:500]


def _transport_cause(exc: BaseException) -> Optional[BaseException]:
    """The innermost error of urllib3's chain under a clickhouse-connect error (a retry
    error's reason, a protocol error's cause); None when there is none."""
    from urllib3.exceptions import HTTPError

    seen: set[int] = set()
    root, current = None, exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, HTTPError):
            root = current
        reason = getattr(current, "reason", None)
        current = reason if isinstance(reason, BaseException) else (current.__cause__ or current.__context__)
    return root


def _never_sent(exc: BaseException) -> bool:
    """The transport error happened before the request reached the server (connect
    refused or timed out), so repeating it cannot apply anything twice."""
    from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

    return isinstance(_transport_cause(exc), (NewConnectionError, ConnectTimeoutError))

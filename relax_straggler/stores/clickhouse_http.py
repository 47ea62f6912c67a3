"""ClickHouse's HTTP interface: one request per statement, errors keyed by their numeric code.

Every recovery decision of the ClickHouse store is taken on ``ClickHouseError.code``, the
server's error code: the ``X-ClickHouse-Exception-Code`` header where the server sends it
(19.x and later), else the code parsed from the error text, which has two forms:

    18.16:  Code: 60, e.displayText() = DB::Exception: Table d.t doesn't exist., e.what() = ...
    modern: Code: 60. DB::Exception: Table d.t does not exist. (UNKNOWN_TABLE) (version 26.9...)

Retries are bounded and back off: a request that never reached the server (connection
refused, connect timeout) and one the server refused as transient (too many queries or
parts) is sent again; a read also after the connection broke mid-way. An INSERT whose
connection broke after it was sent is not repeated (the server may have applied it): it
raises StoreError saying so, and the caller decides.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from typing import Iterator, Mapping, Optional
from urllib.parse import unquote, urlsplit

import httpx

from relax_straggler.stores.base import StoreError

# Error codes (ClickHouse's src/Common/ErrorCodes.cpp); the names are those modern servers print.
NO_SUCH_COLUMN_IN_TABLE = 16
UNKNOWN_IDENTIFIER = 47
UNKNOWN_TABLE = 60
UNKNOWN_DATABASE = 81
READONLY = 164
ACCESS_DENIED = 497
UNKNOWN_USER = 192
WRONG_PASSWORD = 193
AUTHENTICATION_FAILED = 516
# The table or database is gone: the writer creates it again.
MISSING_TABLE_CODES = frozenset({UNKNOWN_TABLE, UNKNOWN_DATABASE})
# The table's columns are not what the store read: it reads them again.
CHANGED_COLUMNS_CODES = frozenset({NO_SUCH_COLUMN_IN_TABLE, UNKNOWN_IDENTIFIER})
# The user may not do this: retrying cannot help.
PERMISSION_CODES = frozenset({READONLY, ACCESS_DENIED, UNKNOWN_USER, WRONG_PASSWORD, AUTHENTICATION_FAILED})
# Refused for now: TIMEOUT_EXCEEDED, TOO_MANY_SIMULTANEOUS_QUERIES, SOCKET_TIMEOUT,
# NETWORK_ERROR, TOO_MANY_PARTS, TABLE_IS_READ_ONLY (a replica without its keeper).
TRANSIENT_CODES = frozenset({159, 202, 209, 210, 252, 242})

_TEXT_CODE = re.compile(r"Code: (\d+)[.,]")
_OLD_TEXT = re.compile(r"Code: \d+, e\.displayText\(\) = (?:DB::Exception: )?(.*?)(?:, e\.what\(\) = .*)?$", re.S)
_NEW_TEXT = re.compile(r"Code: \d+\. (?:DB::Exception: )?(.*?)(?: \(version [^)]*\))?$", re.S)


class ClickHouseError(StoreError):
    """The server refused a statement. code: ClickHouse's error code (0 when the answer
    carried none, e.g. a proxy's page); str(): the store, the code and the server's text."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def error_code(headers: Mapping[str, str], text: str) -> int:
    """The error code of a failed answer: the X-ClickHouse-Exception-Code header, else
    the first `Code: N` of the body (both text forms), else 0."""
    header = headers.get("x-clickhouse-exception-code", "").strip()
    if header.isdigit():
        return int(header)
    m = _TEXT_CODE.search(text)
    return int(m.group(1)) if m else 0


def error_text(text: str) -> str:
    """The server's message without the framing of either text form (at most 500 chars)."""
    text = text.strip()
    m = _OLD_TEXT.search(text) if "e.displayText()" in text else _NEW_TEXT.search(text)
    return (m.group(1).strip() if m else text)[:500]


def redact(url: str) -> str:
    """`url` with its password replaced by ***, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)).geturl()


class ClickHouseHTTP:
    """Statements over HTTP to `base_url` as `user` (None: the server's default user).

    timeout_s: connect and each read, s; retries: extra attempts of a request that can be
    repeated (see the module docstring), waiting backoff_s, doubling. Thread-safe.
    """

    def __init__(self, base_url: str, name: str, user: Optional[str] = None, password: str = "",
                 timeout_s: float = 30.0, retries: int = 1, backoff_s: float = 0.05) -> None:
        if retries < 0 or backoff_s < 0:
            raise ValueError(f"retries must be >= 0 and backoff_s >= 0, got {retries}, {backoff_s}")
        self.name = name  # the store, as messages name it
        self.user = user or "default"
        auth = httpx.BasicAuth(user, password) if user else None
        self._http = httpx.Client(base_url=base_url, timeout=timeout_s, auth=auth)
        self._retries, self._backoff_s = retries, backoff_s

    def query(self, sql: str, body: Optional[bytes] = None, settings: Optional[Mapping[str, str]] = None) -> bytes:
        """Runs `sql` (`body`: the data of an INSERT ... FORMAT; `settings`: server settings
        of that INSERT, sent as URL parameters, which 18.16 takes where it has no INSERT
        ... SETTINGS) and returns the answer. Raises ClickHouseError when the server
        refuses, StoreError when it cannot be reached (after the retries) or an INSERT's
        connection broke after it was sent."""
        is_insert = body is not None
        for attempt in range(self._retries + 1):
            try:
                if is_insert:
                    # wait_end_of_query: the status comes after the whole insert, so a 200 is an acknowledgment
                    params = {**(settings or {}), "query": sql, "wait_end_of_query": "1"}
                    response = self._http.post("/", params=params, content=body)
                else:
                    response = self._http.post("/", content=sql.encode("utf-8"))
            except httpx.HTTPError as exc:
                sent = not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout))
                if (is_insert and sent) or attempt == self._retries:
                    raise self._transport_error(exc, is_insert and sent) from None
                self._wait(attempt)
                continue
            if response.status_code == 200:
                return response.content
            error = self._server_error(response.headers, response.text)
            if error.code not in TRANSIENT_CODES or attempt == self._retries:
                raise error
            self._wait(attempt)
        raise AssertionError("unreachable")

    @contextmanager
    def stream(self, sql: str) -> Iterator[Iterator[bytes]]:
        """The answer of `sql` as chunks of bytes, read as they arrive (never held whole).
        Raises as query(); a connection that breaks part way raises StoreError."""
        for attempt in range(self._retries + 1):
            try:
                with self._http.stream("POST", "/", content=sql.encode("utf-8")) as response:
                    if response.status_code != 200:
                        error = self._server_error(response.headers, response.read().decode("utf-8", "replace"))
                        if error.code in TRANSIENT_CODES and attempt < self._retries:
                            self._wait(attempt)
                            continue
                        raise error
                    yield self._chunks(response)
                    return
            except httpx.HTTPError as exc:
                if attempt == self._retries:
                    raise self._transport_error(exc, False) from None
                self._wait(attempt)

    def ping(self) -> None:
        """Returns when the server answers /ping; raises StoreError otherwise (no retry)."""
        try:
            response = self._http.get("/ping")
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, False) from None
        if response.status_code != 200:
            raise StoreError(f"{self.name}: /ping answered HTTP {response.status_code}")

    def close(self) -> None:
        self._http.close()

    def _chunks(self, response: httpx.Response) -> Iterator[bytes]:
        try:
            yield from response.iter_bytes()
        except httpx.HTTPError as exc:
            raise self._transport_error(exc, False) from None

    def _server_error(self, headers: Mapping[str, str], text: str) -> ClickHouseError:
        code = error_code(headers, text)
        return ClickHouseError(f"{self.name}: code {code}: {error_text(text)}", code)

    def _transport_error(self, exc: httpx.HTTPError, maybe_applied: bool) -> StoreError:
        note = "; the insert may or may not have been applied" if maybe_applied else ""
        return StoreError(f"{self.name}: {type(exc).__name__}: {exc}{note}")

    def _wait(self, attempt: int) -> None:
        time.sleep(self._backoff_s * 2**attempt)


def credentials(url: str) -> tuple[Optional[str], str]:
    """(user, password) of a clickhouse://USER[:PASSWORD]@HOST URL; (None, '') without."""
    parts = urlsplit(url)
    if parts.username is None:
        return None, ""
    return unquote(parts.username), unquote(parts.password or "")

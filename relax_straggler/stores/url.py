"""Store URLs: the one parser (opener.open_store opens the store a URL names).

    file://DIR                     FileStore, the embedded default (no server)
    clickhouse://HOST[:PORT][/DB][?table=NAME]
                                   ClickHouseStore (a ClickHouse server over HTTP; PORT
                                   default 8123, DB default 'default', NAME default
                                   megatron_metrics: a MergeTree or a Distributed table)

``?table=NAME`` is part of a ClickHouse store's address: every command that takes a store
URL accepts it, and ``StoreURL.url`` keeps it. A URL may also carry a query whose
parameters its user accepts: ``?job=ID`` (the live sink, ingest, the feed) and
``&first=N&last=M`` (an analysis input's iteration range).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Collection, Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

from relax_straggler.stores.base import check_job_id

QUERY_PARAMETERS = ("job", "first", "last")
# The store's own parameter: which table of DB a ClickHouse store reads and writes.
TABLE_PARAMETER = "table"
DEFAULT_TABLE = "megatron_metrics"
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"  # spliced into SQL between backquotes: nothing else passes


def redact(url: str) -> str:
    """`url` with its password replaced by ***, for messages, logs, answers and state files."""
    parts = urlsplit(url)
    try:
        password = parts.password
    except ValueError:
        password = None
    if password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{password}@", ":***@", 1)).geturl()


@dataclass(frozen=True)
class StoreURL:
    """A parsed store URL.

    url: the store's URL without the caller's parameters (job, first, last; a ClickHouse
    ``?table=`` stays: it names the store), with its password (never print it: ``shown``
    is the one to show); scheme: "file" or "clickhouse"; location: the
    directory (file) or the host (clickhouse); port, database, table: ClickHouse's (None,
    "", "" for a file store); job, first, last: the query's parameters, None when absent.
    """

    url: str
    scheme: str
    location: str
    port: Optional[int]
    database: str
    job: Optional[str] = None
    first: Optional[int] = None
    last: Optional[int] = None
    table: str = ""

    @property
    def shown(self) -> str:
        """url as messages, logs and answers show it: the password replaced by ***."""
        return redact(self.url)


def parse_store_url(url: str, accept: Collection[str] = ()) -> StoreURL:
    """Parses `url`; `accept`: the query parameters allowed (a subset of QUERY_PARAMETERS).

    Raises ValueError naming the URL and the part that is wrong: an unknown scheme, a file
    URL without a directory, a ClickHouse URL without a host or with a database name other
    than letters, digits and '_' (it is spliced into SQL), a ``table`` parameter on a file
    URL or naming anything but letters, digits and '_', a malformed or unknown query
    parameter, an iteration that is not an integer >= 0 or a range whose first is after
    its last.
    """
    parts = urlsplit(url)
    base = urlunsplit(parts._replace(query=""))
    if parts.scheme == "file":
        path = (parts.netloc + parts.path) if parts.netloc else parts.path
        if not path:
            raise ValueError(f"store URL {redact(url)!r}: file:// needs a directory, e.g. file:///var/lib/straggler")
        scheme, location, port, database = "file", path, None, ""
    elif parts.scheme == "clickhouse":
        if not parts.hostname:
            raise ValueError(f"store URL {redact(url)!r}: clickhouse:// needs a host, e.g. clickhouse://127.0.0.1:8123/default")
        try:
            port = parts.port or 8123
        except ValueError:  # the text after the host's ':' is no number, e.g. a password with '/'
            raise ValueError(f"store URL clickhouse://{parts.hostname}...: the port is not a number from 1 to "
                             "65535 (characters such as '/', '?', '#' or '@' in a user or password must be "
                             "percent-encoded, e.g. %2F)") from None
        database = parts.path.strip("/") or "default"
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", database):
            raise ValueError(f"store URL {redact(url)!r}: database {database!r} must be letters, digits and '_'")
        scheme, location = "clickhouse", parts.hostname
    else:
        raise ValueError(f"store URL {redact(url)!r}: scheme must be file:// or clickhouse://")
    store_parameters = (TABLE_PARAMETER,) if scheme == "clickhouse" else ()
    query = _query(url, parts.query, (*accept, *store_parameters))
    first, last = (_iteration(url, name, query.get(name)) for name in ("first", "last"))
    if first is not None and last is not None and first > last:
        raise ValueError(f"store URL {redact(url)!r}: first ({first}) is after last ({last})")
    table = ""
    if scheme == "clickhouse":
        table = query.get(TABLE_PARAMETER, DEFAULT_TABLE)
        if not re.fullmatch(_IDENTIFIER, table):
            raise ValueError(f"store URL {redact(url)!r}: parameter table={table!r} must be letters, digits and '_' "
                             "(a table name, first not a digit)")
        if TABLE_PARAMETER in query:
            base = f"{base}?{TABLE_PARAMETER}={table}"
    return StoreURL(base, scheme, location, port, database, query.get("job"), first, last, table)


def parse_writer_url(url: str) -> StoreURL:
    """A writer's URL, ``STORE_URL[?job=ID]`` (the live sink, ingest, the feed): the rows it
    writes must be reachable through the monitor's API, so a job id must pass check_job_id.
    Raises ValueError naming the URL."""
    parsed = parse_store_url(url, accept=("job",))
    if parsed.job is not None:
        try:
            check_job_id(parsed.job)
        except ValueError as exc:
            raise ValueError(f"store URL {redact(url)!r}: {exc}") from None
    return parsed


def _query(url: str, text: str, accept: Collection[str]) -> dict[str, str]:
    """The last value of each query parameter; ValueError for a malformed or unknown one."""
    names = (*QUERY_PARAMETERS, TABLE_PARAMETER)
    expected = "&".join(f"{name}=..." for name in names if name in accept) or "no query"
    try:
        query = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text))
    except ValueError as exc:
        raise ValueError(f"store URL {redact(url)!r}: malformed query ({exc}); expected {expected}") from None
    unknown = sorted(set(query) - set(accept))
    if unknown:
        raise ValueError(f"store URL {redact(url)!r}: unknown parameter(s) {unknown}; expected {expected}")
    return {name: values[-1] for name, values in query.items()}


def _iteration(url: str, name: str, text: Optional[str]) -> Optional[int]:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"store URL {redact(url)!r}: {name}={text!r} is not an iteration number") from None
    if value < 0:
        raise ValueError(f"store URL {redact(url)!r}: {name} must be >= 0, got {value}")
    return value

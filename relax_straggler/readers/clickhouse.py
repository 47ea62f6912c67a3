"""The megatron_metrics table of a ClickHouse server as an analysis input:

    relax-straggler analyze 'clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]'

job: the job id (required); first, last: the iteration range, inclusive (default: every
iteration of the job). Rows become steps through relax_straggler.readers.metrics_rows (the
converter the monitor uses), so a job analyzed from the store gets the verdict its
recorded file gets. Store failures are reported as InputError naming the URL.
"""

from __future__ import annotations

from typing import Iterator, Optional
from urllib.parse import parse_qs, urlsplit, urlunsplit

from relax_straggler.monitor.store_base import StoreError
from relax_straggler.readers.base import InputError, StepTimes, Topology
from relax_straggler.readers.metrics_rows import StoreSource

SCHEME = "clickhouse://"
LAST_ITERATION = 2**62  # "to the end": iterations are Int64


class ClickHouseSource(StoreSource):
    """StoreSource over a ClickHouseStore whose store errors surface as InputError."""

    def steps(self) -> Iterator[StepTimes]:
        try:
            yield from super().steps()
        except StoreError as exc:
            raise InputError(f"{self.path}: {exc}") from None


def parse_input_url(url: str) -> tuple[str, str, int, int]:
    """(store URL, job, first, last) of an analyze input URL. Raises InputError naming the
    parameter that is missing or wrong."""
    parts = urlsplit(url)
    try:
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InputError(f"{url}: malformed query ({exc}); expected ?job=ID[&first=N&last=M]") from None
    unknown = sorted(set(query) - {"job", "first", "last"})
    if unknown:
        raise InputError(f"{url}: unknown parameter(s) {unknown}; expected ?job=ID[&first=N&last=M]")
    job = query.get("job", [""])[-1]
    if not job:
        raise InputError(f"{url}: the job is missing; add ?job=ID")
    bounds = []
    for name, default in (("first", 0), ("last", LAST_ITERATION)):
        text = query.get(name, [None])[-1]
        try:
            value = default if text is None else int(text)
        except ValueError:
            raise InputError(f"{url}: {name}={text!r} is not an iteration number") from None
        if value < 0:
            raise InputError(f"{url}: {name} must be >= 0, got {value}")
        bounds.append(value)
    if bounds[0] > bounds[1]:
        raise InputError(f"{url}: first ({bounds[0]}) is after last ({bounds[1]})")
    return urlunsplit(parts._replace(query="")), job, bounds[0], bounds[1]


def open_clickhouse(url: str, strict: bool = False, topology: Optional[Topology] = None) -> ClickHouseSource:
    """The ClickHouseSource of an analyze input URL (nothing is read before steps()).
    Raises InputError for a malformed URL."""
    from relax_straggler.monitor.clickhouse_store import ClickHouseStore

    store_url, job, first, last = parse_input_url(url)
    try:
        store = ClickHouseStore(store_url)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    source = ClickHouseSource(store, job, first, last, topology=topology, strict=strict)
    source.path = source.problems.path = url  # what the user typed, in messages and the summary
    return source

"""A job's rows in a metrics store as an analysis input:

    relax-straggler analyze 'clickhouse://HOST:PORT/DB?job=ID[&first=N&last=M]'
    relax-straggler analyze 'file://DIR?job=ID[&first=N&last=M]'

job: the job id (required); first, last: the iteration range, inclusive (default: every
iteration of the job). Rows become steps through relax_straggler.readers.metrics_rows (the
converter the monitor uses), so a job analyzed from the store gets the verdict its
recorded file gets. Store failures are reported as InputError naming the URL.
"""

from __future__ import annotations

from typing import Iterator, Optional

from relax_straggler.common.topology import Topology
from relax_straggler.readers.base import InputError, StepTimes
from relax_straggler.readers.metrics_rows import StoreSource
from relax_straggler.stores.base import StoreError
from relax_straggler.stores.url import QUERY_PARAMETERS, parse_store_url, redact

SCHEMES = ("clickhouse://", "file://")
LAST_ITERATION = 2**62  # "to the end": iterations are Int64


class StoreInputSource(StoreSource):
    """StoreSource whose store errors surface as InputError."""

    def steps(self) -> Iterator[StepTimes]:
        try:
            yield from super().steps()
        except StoreError as exc:
            raise InputError(f"{self.path}: {exc}") from None


def parse_input_url(url: str) -> tuple[str, str, int, int]:
    """(store URL, job, first, last) of an analyze input URL. Raises InputError naming the
    parameter that is missing or wrong."""
    try:
        parsed = parse_store_url(url, accept=QUERY_PARAMETERS)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if not parsed.job:
        raise InputError(f"{redact(url)}: the job is missing; add ?job=ID")
    first = 0 if parsed.first is None else parsed.first
    last = LAST_ITERATION if parsed.last is None else parsed.last
    return parsed.url, parsed.job, first, last


def open_store_input(url: str, strict: bool = False, topology: Optional[Topology] = None) -> StoreInputSource:
    """The source of an analyze input URL (nothing is read before steps()). Raises
    InputError for a malformed URL or a store that cannot be opened (a file store's
    directory missing: it is never created by a read)."""
    from relax_straggler.stores.opener import open_store

    store_url, job, first, last = parse_input_url(url)
    try:
        store = open_store(store_url, create=False)
    except (ValueError, StoreError) as exc:
        raise InputError(str(exc)) from None
    source = StoreInputSource(store, job, first, last, topology=topology, strict=strict)
    source.path = source.problems.path = redact(url)  # what the user typed (no password), in messages and the summary
    return source

"""open_store: the store implementation a URL's scheme names (file:// or clickhouse://)."""

from __future__ import annotations

from relax_straggler.stores.base import Store, StoreError
from relax_straggler.stores.url import parse_store_url


def open_store(url: str, create: bool = True) -> Store:
    """The store at `url` (no query). create: a file store's directory is created when
    missing (False: a missing directory is a StoreError, so a reconnect never starts over on
    an empty one). Raises ValueError for a malformed URL, StoreError when the store cannot be
    opened (directory missing or not creatable, ClickHouse support not installed or the
    server unreachable)."""
    parsed = parse_store_url(url)
    if parsed.scheme == "file":
        from relax_straggler.stores.file import FileStore

        return FileStore(parsed.location, url=url, create=create)
    try:
        from relax_straggler.stores.clickhouse import ClickHouseStore
    except ImportError as exc:
        raise StoreError(f"store URL {url!r}: the ClickHouse store is not available in this installation "
                         f"({exc}); use file://DIR") from None
    return ClickHouseStore(url)

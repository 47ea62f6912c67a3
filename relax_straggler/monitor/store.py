"""Opens a metrics store from its URL (store_base.parse_store_url):

    file://DIR                     FileStore, the embedded default (no server)
    clickhouse://HOST:PORT/DB      ClickHouseStore (a ClickHouse server over HTTP)
"""

from __future__ import annotations

from relax_straggler.monitor.store_base import Store, StoreError, parse_store_url


def open_store(url: str, create: bool = True) -> Store:
    """The store at `url`. create: a file store's directory is created when missing (False:
    a missing directory is a StoreError, so a reconnect never starts over on an empty one).
    Raises ValueError for a malformed URL, StoreError when the store cannot be opened
    (directory missing or not creatable, ClickHouse support not installed or the server
    unreachable)."""
    scheme, where, _, _ = parse_store_url(url)
    if scheme == "file":
        from relax_straggler.monitor.file_store import FileStore

        return FileStore(where, url=url, create=create)
    try:
        from relax_straggler.monitor.clickhouse_store import ClickHouseStore
    except ImportError as exc:
        raise StoreError(f"store URL {url!r}: the ClickHouse store is not available in this installation "
                         f"({exc}); use file://DIR") from None
    return ClickHouseStore(url)

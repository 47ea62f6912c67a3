"""The monitor's connection to its metrics store.

The store is opened at the first poll. A StoreError with the store not answering a ping
closes it; it is opened again with exponential backoff (BACKOFF_FIRST_S doubling up to
BACKOFF_MAX_S), and health() reports the error until then. Once connected, a file store
that vanished must come back: it is never made anew (and empty).
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from relax_straggler.stores.base import Store, StoreError
from relax_straggler.stores.opener import open_store
from relax_straggler.stores.url import redact

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 30.0


class StoreConnection:
    """The store of `url`, opened on demand and again after a failure. clock: wall time, s
    (of `last_ok`); on_error: called at each store error (the monitor counts them).
    store: the open store, None while disconnected; shown: the URL without its password
    (as answers, logs and the state file name it)."""

    def __init__(self, url: str, clock: Callable[[], float], on_error: Callable[[], None]) -> None:
        self.url = url
        self.shown = redact(url)
        self.store: Optional[Store] = None
        self._clock = clock
        self._on_error = on_error
        self._error: Optional[str] = None
        self._errors = 0
        self._last_ok: Optional[float] = None
        self._backoff_s = BACKOFF_FIRST_S
        self._next_connect = 0.0

    def connected(self) -> Optional[Store]:
        """The open store, or one opened now; None while the backoff after a failure runs or
        when opening it failed (a failure, counted)."""
        if self.store is not None:
            return self.store
        if time.monotonic() < self._next_connect:
            return None
        try:
            store = open_store(self.url, create=self._last_ok is None)
            store.ping()
        except StoreError as exc:
            self.failed(exc)
            return None
        log.info("store %s connected", self.shown)
        self.store = store
        self.ok()
        return store

    @staticmethod
    def answers(store: Store) -> bool:
        """True when `store` answers a ping (an error was then one job's, not the store's)."""
        try:
            store.ping()
        except StoreError:
            return False
        return True

    def ok(self) -> None:
        """The store answered: no error, the backoff starts over."""
        self._error = None
        self._backoff_s = BACKOFF_FIRST_S
        self._last_ok = self._clock()

    def failed(self, exc: StoreError) -> None:
        """The store failed with `exc`: closes it and waits the backoff before opening it again."""
        self._errors += 1
        self._on_error()
        if self._error is None:
            log.warning("store error: %s; reconnecting", exc)
        self._error = str(exc)
        if self.store is not None:
            try:
                self.store.close()
            except StoreError:
                pass  # the connection is being dropped anyway
            self.store = None
        self._next_connect = time.monotonic() + self._backoff_s
        self._backoff_s = min(2 * self._backoff_s, BACKOFF_MAX_S)

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    def health(self) -> dict:
        """{"ok", "url", "error", "errors" (store errors so far), "last_ok" (s since the epoch)}."""
        error = self._error
        if error is None and self.store is None:
            error = "not connected yet: the first poll has not run"
        return {"ok": error is None, "url": self.shown, "error": error, "errors": self._errors,
                "last_ok": self._last_ok}

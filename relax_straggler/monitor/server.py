"""How the monitor's API is served: uvicorn, with a deadline for reading each request.

uvicorn closes a keep-alive connection that stays idle, but sets no limit on the time a
client takes to send a request: one that sends its head or body a byte at a time keeps its
connection, and enough of them the server's sockets, as long as it likes (slowloris). Here
a connection whose request has not arrived whole (head and body) `request_timeout_s` after
the connection opened, or after the previous response on it, is closed. A request being
answered is never cut: the deadline covers receiving only.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Optional

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
_RECEIVING = (h11.IDLE, h11.SEND_BODY)  # the client's states while its request is not whole


class RequestDeadlineProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol (h11) with the deadline of the module docstring."""

    request_timeout_s = REQUEST_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: Optional[asyncio.TimerHandle] = None
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state not in _RECEIVING:  # the request is whole (or the connection is ending)
            self._disarm()

    def on_response_complete(self) -> None:
        if not self.transport.is_closing():
            self._arm()  # before the next request, which may be waiting already (pipelining), is read
        super().on_response_complete()

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.request_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self.conn.their_state in _RECEIVING and not self.transport.is_closing():
            log.info("closing a connection from %s: no whole request within %.0f s", self.client,
                     self.request_timeout_s)
            self.transport.close()


def serve(app, host: str, port: int, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
    """Serves `app` on host:port until a signal stops it (uvicorn.run), each request to be
    received within request_timeout_s (s, > 0). Raises SystemExit(3) when the address cannot
    be bound (uvicorn's)."""

    class Protocol(RequestDeadlineProtocol):
        pass

    Protocol.request_timeout_s = request_timeout_s
    uvicorn.run(app, host=host, port=port, log_level="warning", http=Protocol)

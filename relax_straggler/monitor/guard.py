"""Who may talk to the monitor's API: a Host allow-list, a cap on request bodies and an
optional bearer token for the calls that change state.

- Host: a request whose Host header is not allowed gets 400 before any route runs. A web
  page on another site can make a browser send requests to 127.0.0.1 through a name it
  controls (DNS rebinding); such a request carries that name as its Host. The default list
  is the localhost names and the bind address; on a wildcard bind (0.0.0.0, ::) also this
  machine's host name and any IP literal (an address is not a name anyone can rebind).
- Body: a request body over `max_body_bytes` gets 413 (the API's bodies are a few bytes).
- Token: when set, register and unregister need ``Authorization: Bearer TOKEN`` (401
  otherwise), compared in constant time. It comes from a file (--token-file) or the
  environment variable TOKEN_ENV; reads never need it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping, Optional

TOKEN_ENV = "RELAX_STRAGGLER_MONITOR_TOKEN"
LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
MAX_BODY_BYTES = 64 * 1024
_NAME = re.compile(r"[a-z0-9._~-]+")  # a Host name's characters (RFC 3986 unreserved, lower case)
_PORT = re.compile(r"(:[0-9]{0,5})?")


@dataclass(frozen=True)
class ApiGuard:
    """token: required for register / unregister when set; allowed_hosts: Host names served
    (lower case, no port; "*" any); allow_ip_hosts: serve any IP literal too;
    allow_get_registration: serve GET /detect and /undetect (state-changing GETs, which any
    web page can make a browser send: off by default); max_body_bytes: larger bodies get 413."""

    token: Optional[str] = None
    allowed_hosts: frozenset = LOCAL_HOSTS
    allow_ip_hosts: bool = False
    allow_get_registration: bool = False
    max_body_bytes: int = MAX_BODY_BYTES

    def host_allowed(self, host_header: Optional[str]) -> bool:
        """Whether a request with this Host header (None: none sent) is served."""
        if "*" in self.allowed_hosts:
            return True
        host = _host_name(host_header) if host_header else None
        if host is None:
            return False
        if host in self.allowed_hosts:
            return True
        if self.allow_ip_hosts:
            try:
                ipaddress.ip_address(host)
            except ValueError:
                return False
            return True
        return False

    def token_ok(self, authorization: Optional[str]) -> bool:
        """Whether an Authorization header value carries the token (always True without one)."""
        if self.token is None:
            return True
        scheme, _, given = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        return hmac.compare_digest(given.strip().encode(), self.token.encode())


def default_hosts(bind_host: str) -> tuple[frozenset, bool]:
    """(allowed Host names, allow IP literals) for a monitor bound to `bind_host`."""
    bind = bind_host.strip("[]").lower()
    if bind in WILDCARD_BINDS:
        return LOCAL_HOSTS | {socket.gethostname().lower()}, True
    return LOCAL_HOSTS | {bind}, False


def read_token(path: Optional[str], environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The token from the file at `path` (surrounding whitespace stripped), else from
    TOKEN_ENV, else None. Raises ValueError naming the file or variable when it cannot be
    read or is empty."""
    if path is not None:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--token-file {path}: cannot read it: {exc}") from None
        where = f"--token-file {path}"
    elif TOKEN_ENV in environ:
        token, where = environ[TOKEN_ENV].strip(), TOKEN_ENV
    else:
        return None
    if not token:
        raise ValueError(f"{where}: the token is empty")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise ValueError(f"{where}: the token must be one word of printable characters")
    return token


def _host_name(header: str) -> Optional[str]:
    """The name in a Host header: no port, no IPv6 brackets, lower case, no trailing dot.
    None when the header is not `host[:port]` (RFC 9110 section 7.2: a name of letters,
    digits and - . _ ~, an IPv4 address, or an IPv6 address in brackets, also taken bare; a
    port of at most 5 digits): e.g. "localhost:80@evil.com", a URL's user info, which a
    laxer split read as localhost."""
    header = header.strip().lower()
    if header.startswith("["):  # [::1]:8000
        name, closed, port = header[1:].partition("]")
        if not closed or not _PORT.fullmatch(port) or not _is_ipv6(name):
            return None
        return name
    if header.count(":") > 1:  # a bare IPv6 address
        return header if _is_ipv6(header) else None
    name, _, port = header.partition(":")
    if not _NAME.fullmatch(name) or not _PORT.fullmatch(f":{port}" if port else ""):
        return None
    return name.rstrip(".")


def _is_ipv6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


class GuardMiddleware:
    """ASGI middleware applying the Host and body checks of `guard` to HTTP requests
    (the token is checked by the routes that need it, so the OpenAPI schema names it)."""

    def __init__(self, app, guard: ApiGuard) -> None:
        self.app = app
        self.guard = guard

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", ())}
        hosts = [v.decode("latin-1") for k, v in scope.get("headers", ()) if k.lower() == b"host"]
        host = hosts[0] if len(hosts) == 1 else ", ".join(hosts)  # two Host headers: refused, whichever is read
        if len(hosts) != 1 or not self.guard.host_allowed(host):
            await _json(send, 400, f"Host header {host!r} is not allowed: this monitor serves "
                                   f"{', '.join(sorted(self.guard.allowed_hosts))}"
                                   f"{' and IP addresses' if self.guard.allow_ip_hosts else ''} "
                                   "(start it with --allowed-host NAME to add one)")
            return
        limit = self.guard.max_body_bytes
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            await _json(send, 400, "Content-Length is not a number")
            return
        if declared > limit:
            await _json(send, 413, f"request body of {declared:,} bytes; at most {limit:,}")
            return
        # Read the body here (at most limit + 1 bytes kept), so a chunked one is capped too.
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                await self.app(scope, _replay([message]), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > limit:
                await _json(send, 413, f"request body over {limit:,} bytes")
                return
            chunks.append(body)
            more = message.get("more_body", False)
        await self.app(scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}],
                                      receive), send)


def _replay(messages: list, then=None):
    async def receive():
        if messages:
            return messages.pop(0)
        if then is not None:
            return await then()  # e.g. http.disconnect while the response streams
        return {"type": "http.disconnect"}

    return receive


async def _json(send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})

"""A modern ClickHouse engine for tests: chDB (ClickHouse 26.9 in-process) behind a small
HTTP front speaking the part of ClickHouse's HTTP interface the store uses.

    front = ChdbFront(data_dir, port, readonly_users={"reader"}); front.start(); ...; front.stop()

- ``GET /ping`` answers ``Ok.``;
- ``POST /`` runs the statement in the body, or in the ``query`` parameter with the body as
  the data of an ``INSERT ... FORMAT F`` (any format chDB reads: TabSeparated, ArrowStream);
- a failure answers HTTP 404 (unknown table or database) or 500 with the engine's error text
  (``Code: 60. DB::Exception: ... (UNKNOWN_TABLE)``) and the ``X-ClickHouse-Exception-Code``
  header, as a modern server does;
- the user comes from HTTP basic auth or ``X-ClickHouse-User``; a user in `readonly_users`
  gets code 164 (READONLY) for anything but a read, as a ``readonly = 1`` profile does.

stop() closes the port and keeps the engine and its data, so stop() + start() is a server
restart with nothing lost. One engine per process (chDB's rule): every front of a test
run shares it, each on its own databases.

The engine has the cluster ``test_shard_localhost`` (one shard: this engine), as a
server's default configuration does, so Distributed tables work: its configuration
names a TCP port (a free one, never opened: chDB listens on nothing) and the cluster's
replica on it, which makes the shard local. URL parameters of a ``POST`` other than
``query`` are the statement's settings, as on a server (``insert_distributed_sync=1``).
"""

from __future__ import annotations

import base64
import os
import re
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Collection, Optional
from urllib.parse import parse_qs, urlsplit

_engine = None
_engine_lock = threading.Lock()  # chDB runs one statement at a time
_INSERT_DATA = re.compile(r"^(\s*INSERT\s+INTO\s+.+?)\s+FORMAT\s+(\w+)\s*$", re.S | re.I)
_READ = re.compile(r"^\s*(SELECT|WITH|DESCRIBE|DESC|SHOW|EXISTS)\b", re.I)
_CODE = re.compile(r"Code: (\d+)\.")


_CONFIG = """<clickhouse>
    <tcp_port>{port}</tcp_port>
    <remote_servers>
        <test_shard_localhost>
            <shard><replica><host>localhost</host><port>{port}</port></replica></shard>
        </test_shard_localhost>
    </remote_servers>
</clickhouse>
"""
# Settings of the HTTP interface itself, not of the statement.
_HTTP_PARAMETERS = ("query", "wait_end_of_query")


def _session(path: str):
    global _engine
    if _engine is None:
        from chdb import session

        config = f"{path.rstrip('/')}.config.xml"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with open(config, "w") as fh:
            fh.write(_CONFIG.format(port=port))
        _engine = session.Session(f"{path}?config-file={config}")
    return _engine


class ChdbFront:
    """The HTTP front on 127.0.0.1:`port` over the process's chDB engine (data under
    `data_dir` for the first front of the process)."""

    def __init__(self, data_dir: str, port: int, readonly_users: Collection[str] = ()) -> None:
        self.data_dir, self.port, self.readonly_users = data_dir, port, frozenset(readonly_users)
        self._server: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None
        self._connections: set = set()  # open client sockets: a stop closes them, as a server exit does

    def url(self, database: str = "default", user: str = "") -> str:
        who = f"{user}@" if user else ""
        return f"clickhouse://{who}127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        with _engine_lock:
            _session(self.data_dir)
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                front._connections.add(self.connection)

            def finish(self) -> None:
                front._connections.discard(self.connection)
                super().finish()

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/ping":
                    self._answer(200, b"Ok.\n")
                    return
                query = parse_qs(parts.query).get("query", [""])[-1]
                self._run(query, b"")

            def do_POST(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                params = parse_qs(parts.query)
                query = params.get("query", [None])[-1]
                settings = {k: v[-1] for k, v in params.items() if k not in _HTTP_PARAMETERS}
                if query is None:
                    self._run(body.decode("utf-8"), b"", settings)
                else:
                    self._run(query, body, settings)

            def _run(self, sql: str, data: bytes, settings: Optional[dict] = None) -> None:
                user = self._user()
                status, headers, payload = front.execute(sql, data, user, settings or {})
                self._answer(status, payload, headers)

            def _user(self) -> str:
                auth = self.headers.get("Authorization", "")
                if auth.startswith("Basic "):
                    return base64.b64decode(auth[6:]).decode().split(":", 1)[0]
                return self.headers.get("X-ClickHouse-User", "default")

            def _answer(self, status: int, payload: bytes, headers: Optional[dict] = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name=f"chdb-front-{self.port}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for connection in list(self._connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def execute(self, sql: str, data: bytes, user: str = "default",
                settings: Optional[dict] = None) -> tuple[int, dict, bytes]:
        """(HTTP status, headers, body) of one statement, as the front answers it; settings:
        the statement's (of an INSERT with data only, the one kind the store sends)."""
        if user in self.readonly_users and not _READ.match(sql):
            return _error(f"Code: 164. DB::Exception: {user}: Cannot execute query in readonly mode. (READONLY)")
        path = None
        try:
            if data:
                m = _INSERT_DATA.match(sql)
                if not m:
                    return _error("Code: 62. DB::Exception: the front takes data only for INSERT ... FORMAT F. "
                                  "(SYNTAX_ERROR)")
                fd, path = tempfile.mkstemp(prefix="chdb-insert-", dir=self.data_dir)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(data)
                if not all(re.fullmatch(r"\w+", k + v) for k, v in (settings or {}).items()):
                    return _error(f"Code: 115. DB::Exception: the front takes settings NAME=VALUE of letters, "
                                  f"digits and _, got {settings}. (UNKNOWN_SETTING)")
                given = ", ".join(f"{k} = {v}" for k, v in (settings or {}).items())
                sql = f"{m.group(1)} FROM INFILE '{path}' {'SETTINGS ' + given if given else ''} FORMAT {m.group(2)}"
            sql, fmt = _split_format(sql)
            with _engine_lock:
                result = _engine.query(sql, fmt)
            return 200, {}, bytes(result.bytes()) if result is not None else b""
        except Exception as exc:  # the engine's error, as a server answers it
            return _error(str(exc))
        finally:
            if path is not None:
                os.unlink(path)


def _split_format(sql: str) -> tuple[str, str]:
    """chDB takes the output format as an argument; a SELECT's trailing FORMAT F is it."""
    m = re.search(r"\s+FORMAT\s+(\w+)\s*;?\s*$", sql, re.I)
    if m and _READ.match(sql):
        return sql[:m.start()], m.group(1)
    return sql, "TabSeparated"


def _error(text: str) -> tuple[int, dict, bytes]:
    m = _CODE.search(text)
    code = int(m.group(1)) if m else 1001
    status = 404 if code in (60, 81) else 500
    return status, {"X-ClickHouse-Exception-Code": str(code)}, (text.strip() + "\n").encode()

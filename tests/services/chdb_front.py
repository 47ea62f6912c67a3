"""A modern ClickHouse server for tests: chDB (ClickHouse 26.9 in-process) behind a small
HTTP front speaking the part of ClickHouse's HTTP interface that clickhouse-connect uses.

    python tests/services/chdb_front.py DATA_DIR PORT --readonly-user reader   # a server process
    front = ChdbFront(data_dir, port, readonly_users={"reader"}); front.start(); ...; front.stop()

- ``GET /ping`` answers ``Ok.``;
- ``POST /`` runs the statement in the body, or in the ``query`` parameter with the body as
  the data of an ``INSERT ... FORMAT F`` (any format chDB reads: Arrow, TabSeparated; the
  body lz4, zstd or gzip encoded as its Content-Encoding says), with the query parameters
  ``param_NAME`` and the settings in the URL; an answer carries ``X-ClickHouse-Summary``
  (rows read and written);
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
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
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
# Parameters of the HTTP interface itself, not settings of the statement (a server takes
# these from the URL; clickhouse-connect sends them).
_HTTP_PARAMETERS = frozenset({"query", "wait_end_of_query", "database", "session_id", "session_timeout", "session_check",
                              "query_id", "quota_key", "compress", "decompress", "enable_http_compression", "role",
                              "send_progress_in_http_headers", "http_headers_progress_interval_ms", "buffer_size",
                              "cancel_http_readonly_queries_on_client_close", "default_format",
                              "client_protocol_version"})
_SETTING = re.compile(r"[\w.\-]+")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session(path: str):
    global _engine
    if _engine is None:
        from chdb import session

        config = f"{path.rstrip('/')}.config.xml"
        with open(config, "w") as fh:
            fh.write(_CONFIG.format(port=free_port()))
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
                body = _decoded(body, self.headers.get("Content-Encoding", ""))
                params = parse_qs(parts.query)
                query = params.get("query", [None])[-1]
                values = {k[len("param_"):]: v[-1] for k, v in params.items() if k.startswith("param_")}
                settings = {k: v[-1] for k, v in params.items()
                            if k not in _HTTP_PARAMETERS and not k.startswith("param_")}
                if query is None:
                    self._run(body.decode("utf-8"), b"", settings, values)
                else:
                    self._run(query, body, settings, values)

            def _run(self, sql: str, data: bytes, settings: Optional[dict] = None,
                     values: Optional[dict] = None) -> None:
                user = self._user()
                status, headers, payload = front.execute(sql, data, user, settings or {}, values or {})
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

    def execute(self, sql: str, data: bytes, user: str = "default", settings: Optional[dict] = None,
                values: Optional[dict] = None) -> tuple[int, dict, bytes]:
        """(HTTP status, headers, body) of one statement, as the front answers it. settings:
        the statement's (applied to an INSERT with data and to a read; other statements run
        with the engine's); values: the query parameters ({name:Type} in the statement)."""
        if user in self.readonly_users and not _READ.match(sql):
            return _error(f"Code: 164. DB::Exception: {user}: Cannot execute query in readonly mode. (READONLY)")
        if not all(_SETTING.fullmatch(k) and _SETTING.fullmatch(v) for k, v in (settings or {}).items()):
            return _error(f"Code: 115. DB::Exception: the front takes settings NAME=VALUE of letters, digits, "
                          f"'.', '-' and _, got {settings}. (UNKNOWN_SETTING)")
        given = ", ".join(f"{k} = {v if v.isdigit() else repr(v)}" for k, v in (settings or {}).items())
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
                sql = f"{m.group(1)} FROM INFILE '{path}' {'SETTINGS ' + given if given else ''} FORMAT {m.group(2)}"
            sql, fmt = _split_format(sql)
            if given and _READ.match(sql) and not data:
                sql = f"{sql.rstrip().rstrip(';')} SETTINGS {given}"
            with _engine_lock:
                result = _engine.query(sql, fmt, params=values or None)
            if result is None:
                return 200, {}, b""
            summary = {"read_rows": str(result.rows_read()), "written_rows": str(result.rows_written())}
            return 200, {"X-ClickHouse-Summary": json.dumps(summary)}, bytes(result.bytes())
        except Exception as exc:  # the engine's error, as a server answers it
            return _error(str(exc))
        finally:
            if path is not None:
                os.unlink(path)


def _decoded(body: bytes, encoding: str) -> bytes:
    """The request body without its Content-Encoding (the ones clickhouse-connect sends)."""
    if encoding in ("", "identity"):
        return body
    if encoding == "lz4":
        import lz4.frame

        return lz4.frame.decompress(body)
    if encoding == "zstd":
        from backports import zstd

        return zstd.decompress(body)
    if encoding == "gzip":
        import gzip

        return gzip.decompress(body)
    raise ValueError(f"the front cannot decode Content-Encoding {encoding!r}")


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


class ServerProcess:
    """This front as a server process on 127.0.0.1:`port` (None: a free one), data under
    `directory` (user `reader` read-only). start() returns once it answers /ping; stop()
    ends it (SIGTERM) and kill() kills it (SIGKILL), each waiting for it to exit; start()
    again on the same directory is a server restart with what it had written kept."""

    def __init__(self, directory: str, port: Optional[int] = None) -> None:
        self.directory, self.port = str(directory), port if port is not None else free_port()
        self._proc: Optional[subprocess.Popen] = None

    def url(self, database: str = "default", user: str = "") -> str:
        who = f"{user}@" if user else ""
        return f"clickhouse://{who}127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 120.0) -> None:
        import urllib.request

        log_path = os.path.join(self.directory, "front.log")
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), os.path.join(self.directory, "data"),
                                           str(self.port), "--readonly-user", "reader"], stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while True:
            if self._proc.poll() is not None:
                with open(log_path, errors="replace") as fh:
                    raise RuntimeError(f"the ClickHouse front exited ({self._proc.returncode}): {fh.read()[-2000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/ping", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ClickHouse front did not answer /ping within {timeout_s} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._end(signal.SIGTERM)

    def kill(self) -> None:
        self._end(signal.SIGKILL)

    def _end(self, sig: int) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(sig)
            self._proc.wait(timeout=60)
        self._proc = None


def main(argv: Optional[list] = None) -> None:
    """`python tests/services/chdb_front.py DATA_DIR PORT [--readonly-user NAME ...]`: a
    server process (its own chDB engine, data under DATA_DIR) until SIGTERM or SIGINT;
    killing it and starting it again on the same DATA_DIR is a server restart."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir")
    parser.add_argument("port", type=int)
    parser.add_argument("--readonly-user", action="append", default=[])
    args = parser.parse_args(argv)
    front = ChdbFront(args.data_dir, args.port, readonly_users=args.readonly_user)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    front.start()
    done.wait()
    front.stop()
    with _engine_lock:
        _engine.close()  # what an orderly stop owes: the engine's tables closed
    # Interpreter teardown with the engine's threads still alive once hung past a minute;
    # nothing is left to do.
    os._exit(0)


if __name__ == "__main__":
    main()

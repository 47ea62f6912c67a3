"""The store's policy over clickhouse-connect (stores/clickhouse_client.py) where a real
server cannot show it on demand: a row count the server did not confirm, a connection that
broke after an insert was sent, transient refusals, a server too old for the client. The
driver is replaced by a stub that raises clickhouse-connect's own errors."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
import urllib3.exceptions
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError

from relax_straggler.stores.base import StoreError
from relax_straggler.stores.clickhouse_client import ClickHouseClient, ClickHouseError

ROWS = pa.table({"a": [1, 2, 3]})


class Summary:
    def __init__(self, written_rows: int) -> None:
        self.written_rows = written_rows


def transport_error(cause: Exception) -> OperationalError:
    """An error as clickhouse-connect raises it for a failed request: `cause` under urllib3's."""
    try:
        try:
            raise cause
        except Exception as inner:
            raise OperationalError("Error executing HTTP request") from urllib3.exceptions.MaxRetryError(
                None, "/", inner)
    except OperationalError as exc:
        return exc


class StubDriver:
    """Answers each call with the next of `answers` (an exception is raised); counts calls."""

    def __init__(self, answers: list) -> None:
        self.answers, self.calls = list(answers), []

    def _next(self, name: str):
        self.calls.append(name)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def insert_arrow(self, table, rows, settings=None):
        assert settings["wait_end_of_query"] == "1"  # acknowledged only after the whole insert
        return self._next("insert")

    def command(self, sql, parameters=None):
        return self._next("command")

    def query_arrow_stream(self, sql, parameters=None, use_strings=None):
        return self._next("stream")

    def close(self) -> None:
        pass


@pytest.fixture
def stub(monkeypatch):
    """client(answers, retries=1) -> (ClickHouseClient over a StubDriver, the driver)."""
    import clickhouse_connect

    def make(answers: list, retries: int = 1, connect_error: Exception | None = None, connect_errors: int = 1):
        driver = StubDriver(answers)
        failed = []

        def get_client(**kwargs):
            if connect_error is not None and len(failed) < connect_errors:
                failed.append(connect_error)
                raise connect_error
            return driver

        monkeypatch.setattr(clickhouse_connect, "get_client", get_client)
        return ClickHouseClient("127.0.0.1", 1, "clickhouse://127.0.0.1:1/db", retries=retries, backoff_s=0), driver

    return make


def test_an_insert_the_server_counts_short_is_an_error(stub):
    client, _ = stub([Summary(2)])
    with pytest.raises(StoreError, match=r"the server wrote 2 of the 3 rows of an insert into `db`.`t`"):
        client.insert("`db`.`t`", ROWS)
    client, _ = stub([Summary(6)])  # more: a materialized view's rows, counted too
    client.insert("`db`.`t`", ROWS)
    client, _ = stub([Summary(0)])  # a Distributed table counts its hops, or none
    client.insert("`db`.`t`", ROWS, check_count=False)


def test_an_insert_whose_connection_broke_after_sending_is_not_repeated(stub):
    broke = transport_error(urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104)))
    client, driver = stub([broke, Summary(3)], retries=3)
    with pytest.raises(StoreError, match=r"ProtocolError.*the insert may or may not have been applied"):
        client.insert("`db`.`t`", ROWS)
    assert driver.calls == ["insert"]


def test_an_insert_refused_before_it_was_sent_is_repeated(stub):
    refused = transport_error(urllib3.exceptions.NewConnectionError(None, "Connection refused"))
    client, driver = stub([refused, Summary(3)], retries=1)
    client.insert("`db`.`t`", ROWS)
    assert driver.calls == ["insert", "insert"]
    client, driver = stub([refused, refused], retries=1)
    with pytest.raises(StoreError, match=r"NewConnectionError: .*Connection refused"):
        client.insert("`db`.`t`", ROWS)


def test_transient_server_codes_are_retried_and_others_are_not(stub):
    busy = DatabaseError("Received ClickHouse exception, code: 202, server response: Code: 202. DB::Exception: "
                         "Too many simultaneous queries. (TOO_MANY_SIMULTANEOUS_QUERIES)", code=202)
    client, driver = stub([busy, None], retries=1)
    client.command("SELECT 1")
    assert driver.calls == ["command", "command"]
    syntax = DatabaseError("Received ClickHouse exception, code: 62, server response: Code: 62. DB::Exception: "
                           "Syntax error (SYNTAX_ERROR) (for url http://127.0.0.1:1)", code=62)
    client, driver = stub([syntax, None], retries=3)
    with pytest.raises(ClickHouseError, match=r"^clickhouse://127.0.0.1:1/db: code 62: Syntax error \(SYNTAX_ERROR\)$") as info:
        client.command("SELEKT 1")
    assert info.value.code == 62 and driver.calls == ["command"]
    assert "for url" not in str(info.value)


def test_a_server_too_old_for_the_client_is_named(stub):
    # What clickhouse-connect 1.12.0 gets from Debian's 18.16 when it connects.
    old = DatabaseError("Received ClickHouse exception, code: 47, server response: Code: 47, e.displayText() = "
                        "DB::Exception: Unknown identifier: readonly", code=47)
    client, _ = stub([], connect_error=old)
    with pytest.raises(StoreError, match=r"too old for clickhouse-connect.*Unknown identifier: readonly.*tested on ClickHouse 26\.9"):
        client.command("SELECT 1")


class BrokenStream:
    """An Arrow answer whose connection breaks after the first batch."""

    def __init__(self) -> None:
        self.batches = iter([pa.record_batch({"a": [1]})])

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self.batches, None)
        if batch is None:
            raise urllib3.exceptions.ProtocolError("Connection broken: IncompleteRead(10 bytes read, 90 more expected)")
        return batch


def test_an_answer_that_breaks_off_is_a_store_error(stub):
    client, _ = stub([BrokenStream()])
    with pytest.raises(StoreError, match=r"the answer broke off: ProtocolError: Connection broken: IncompleteRead"):
        with client.batches("SELECT a FROM t") as batches:
            assert next(batches).num_rows == 1
            next(batches)


def test_a_transient_refusal_while_connecting_is_retried(stub):
    busy = DatabaseError("Received ClickHouse exception, code: 202, server response: Code: 202. DB::Exception: "
                         "Too many simultaneous queries. (TOO_MANY_SIMULTANEOUS_QUERIES)", code=202)
    client, driver = stub([None], retries=1, connect_error=busy)
    client.command("SELECT 1")
    assert driver.calls == ["command"]
    denied = DatabaseError("Received ClickHouse exception, code: 516, server response: Code: 516. DB::Exception: "
                           "ops: Authentication failed. (AUTHENTICATION_FAILED)", code=516)
    client, driver = stub([None], retries=3, connect_error=denied)
    with pytest.raises(ClickHouseError, match=r"code 516: ops: Authentication failed") as info:
        client.command("SELECT 1")
    assert info.value.permanent and driver.calls == []


def test_a_server_that_is_down_logs_nothing_but_the_store_s_own_error(caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name in ("urllib3", "clickhouse_connect"):  # they warn per failed request
        caplog.set_level(logging.DEBUG + 1, logger=name)
    client = ClickHouseClient("127.0.0.1", port, f"clickhouse://127.0.0.1:{port}/db", retries=2, backoff_s=0)
    with pytest.raises(StoreError, match="Connection refused"):
        client.insert("`db`.`t`", ROWS)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    logging.getLogger("urllib3.connectionpool").warning("another library's request")  # passes the filter
    assert [r.getMessage() for r in caplog.records] == ["another library's request"]

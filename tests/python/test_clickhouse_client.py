"""The store's policy over clickhouse-connect (stores/clickhouse_client.py) where a real
server cannot show it on demand: a row count the server did not confirm, a connection that
broke after an insert was sent, transient refusals, a server too old for the client. The
driver is replaced by a stub that raises clickhouse-connect's own errors."""

from __future__ import annotations

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

    def close(self) -> None:
        pass


@pytest.fixture
def stub(monkeypatch):
    """client(answers, retries=1) -> (ClickHouseClient over a StubDriver, the driver)."""
    import clickhouse_connect

    def make(answers: list, retries: int = 1, connect_error: Exception | None = None):
        driver = StubDriver(answers)

        def get_client(**kwargs):
            if connect_error is not None:
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
    with pytest.raises(ClickHouseError, match=r"code 62: Code: 62\. DB::Exception: Syntax error") as info:
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

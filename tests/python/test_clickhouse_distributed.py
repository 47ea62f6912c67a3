"""ClickHouseStore beyond one table name and one machine: ``?table=NAME`` and a Distributed
table over a local MergeTree (cluster ``test_shard_localhost``, which the test server's
configuration defines, tests/services/chdb_front.py)."""

from __future__ import annotations

import itertools

import httpx
import pytest

from relax_straggler.readers.store_input import parse_input_url
from relax_straggler.stores.base import STEP_METRIC, Sample, StoreError, samples_to_table
from relax_straggler.stores.clickhouse import ClickHouseStore
from relax_straggler.stores.clickhouse_layout import own_ddl
from relax_straggler.stores.url import parse_store_url, parse_writer_url

_databases = itertools.count()
T0 = 1_790_000_000.0


def admin(engine, sql: str) -> str:
    response = httpx.post(f"http://127.0.0.1:{engine.port}/", content=sql.encode())
    assert response.status_code == 200, response.text
    return response.text


def rows(job: str, iterations: range, ranks: int) -> list[Sample]:
    out = []
    for it in iterations:
        for r in range(ranks):
            out.append(Sample(T0 + it + r / 1000, job, STEP_METRIC, r, it, (100.0 + r,), node=f"n{r}", cluster="c"))
            out.append(Sample(T0 + it, job, "forward-compute", r, it, (40.0 + r, 2.5), subname="mb"))
    return out


def by_key(samples):
    return sorted(samples, key=lambda s: (s.iteration, s.rank, s.metric_name, s.subname))


# The URL's table parameter --------------------------------------------------------------
def test_the_table_parameter_names_the_table_and_stays_in_the_store_url():
    parsed = parse_store_url("clickhouse://h:8124/db?table=metrics_all")
    assert (parsed.table, parsed.url) == ("metrics_all", "clickhouse://h:8124/db?table=metrics_all")
    assert parse_store_url("clickhouse://h/db").table == "megatron_metrics"
    assert parse_store_url("file:///s").table == ""
    # Every command takes it: the sink's, ingest's and feed's URL, an analyze input, the monitor's.
    assert parse_writer_url("clickhouse://h/db?table=t1&job=j").url == "clickhouse://h/db?table=t1"
    store_url, job, first, _ = parse_input_url("clickhouse://h/db?job=j&table=t1&first=2")
    assert (store_url, job, first) == ("clickhouse://h/db?table=t1", "j", 2)
    assert ClickHouseStore("clickhouse://h/db?table=t1")._table == "`db`.`t1`"


@pytest.mark.parametrize("url, message", [
    ("clickhouse://h/db?table=a-b", r"parameter table='a-b' must be letters, digits and '_'"),
    ("clickhouse://h/db?table=x`;DROP", r"parameter table='x`;DROP' must be letters"),
    ("clickhouse://h/db?table=1abc", r"parameter table='1abc'"),
    ("clickhouse://h/db?table=", r"parameter table='' must be"),
    ("file:///s?table=t", r"unknown parameter\(s\) \['table'\]"),
])
def test_a_bad_table_parameter_is_refused_naming_it(url, message):
    with pytest.raises(ValueError, match=message):
        parse_store_url(url)


def test_a_named_table_is_used_and_created_alone(clickhouse_server):
    db = f"test_dist_{next(_databases)}"
    store = ClickHouseStore(clickhouse_server.url(db) + "?table=timers_b")
    try:
        store.write(rows("j", range(2), ranks=2))
        assert admin(clickhouse_server, f"SHOW TABLES FROM {db}").split() == ["timers_b"]
        assert by_key(store.samples("j", 0, 9)) == by_key(rows("j", range(2), ranks=2))
        assert [i.iteration for i in store.iterations("j")] == [0, 1] and store.jobs() == ["j"]
    finally:
        store.close()
    default = ClickHouseStore(clickhouse_server.url(db))
    try:
        assert default.jobs() == [] and default.layout() is None  # megatron_metrics was never made
    finally:
        default.close()


# A Distributed table ---------------------------------------------------------------------
def make_distributed(engine, db: str, table: str = "megatron_metrics") -> None:
    """The cluster DDL of docs/STORES.md on a one-shard cluster: the local table (a plain
    MergeTree here: no keeper) and the Distributed table over it."""
    admin(engine, f"CREATE DATABASE {db}")
    admin(engine, own_ddl(f"{db}.{table}_local"))
    admin(engine, f"CREATE TABLE {db}.{table} AS {db}.{table}_local "
                  f"ENGINE = Distributed('test_shard_localhost', '{db}', '{table}_local', rand())")


def test_reads_and_writes_go_through_a_distributed_table(clickhouse_server):
    db = f"test_dist_{next(_databases)}"
    make_distributed(clickhouse_server, db)
    store = ClickHouseStore(clickhouse_server.url(db))
    try:
        assert store.layout().distributed
        written = rows("j", range(3), ranks=4)
        store.write(written[:12])
        store.write_table(samples_to_table(written[12:]))
        # Acknowledged = on the shard: the local table holds every row once the write returns.
        assert admin(clickhouse_server, f"SELECT count() FROM {db}.megatron_metrics_local").strip() == str(len(written))
        assert by_key(store.samples("j", 0, 9)) == by_key(written)
        assert store.table("j", 1, 1).num_rows == 8
        assert [(i.iteration, i.ranks, i.step_ms) for i in store.iterations("j")] == [(it, 4, 103.0) for it in
                                                                                       range(3)]
        assert store.jobs() == ["j"]
        assert sorted(admin(clickhouse_server, f"SHOW TABLES FROM {db}").split()) == ["megatron_metrics",
                                                                                    "megatron_metrics_local"]
    finally:
        store.close()


def test_a_missing_local_table_is_an_error_and_nothing_is_created_in_its_place(clickhouse_server):
    db = f"test_dist_{next(_databases)}"
    make_distributed(clickhouse_server, db)
    store = ClickHouseStore(clickhouse_server.url(db))
    try:
        store.write(rows("j", range(1), ranks=1))
        admin(clickhouse_server, f"DROP TABLE {db}.megatron_metrics_local")
        for call in (lambda: store.iterations("j"), lambda: list(store.samples("j", 0, 9)), store.jobs,
                     lambda: store.write(rows("j", range(1, 2), ranks=1))):
            with pytest.raises(StoreError, match=r"`megatron_metrics` exists but a table it reads is missing "
                                                 r"\(the table under this Distributed table.*ON CLUSTER .*code 60"):
                call()
        assert admin(clickhouse_server, f"SHOW TABLES FROM {db}").split() == ["megatron_metrics"]
    finally:
        store.close()

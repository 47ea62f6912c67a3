"""ClickHouseStore against a ClickHouse 26.9 server process (chDB behind
tests/services/chdb_front.py; conftest.ClickHouseServer)."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from conftest import ClickHouseServer, free_port, require_chdb
from relax_straggler.stores.clickhouse import ClickHouseStore
from relax_straggler.stores.clickhouse_client import ClickHouseError
from relax_straggler.stores.base import STEP_METRIC, IterationTime, Sample, StoreError

_databases = itertools.count()
T0 = 1_790_000_000.0  # a fixed time, s since the epoch


@pytest.fixture
def engine(clickhouse_server):
    """The session's server: url(database, user), port."""
    return clickhouse_server


@pytest.fixture
def store(engine):
    """A store on a database of its own (created by the store on first use)."""
    s = ClickHouseStore(engine.url(f"test_store_{next(_databases)}"))
    yield s
    s.close()


def admin(engine, sql: str) -> str:
    """Runs `sql` as the default user, behind the store's back."""
    response = httpx.post(f"http://127.0.0.1:{engine.port}/", content=sql.encode())
    assert response.status_code == 200, response.text
    return response.text


def step_rows(job: str, iterations: range, ranks: int, t0: float = T0, slow_rank: int = -1) -> list[Sample]:
    """interval-time and forward-compute rows; rank r takes 100 + r ms, slow_rank 300 ms."""
    rows = []
    for it in iterations:
        for r in range(ranks):
            ms = 300.0 if r == slow_rank else 100.0 + r
            ts = t0 + it + r / 1000.0
            rows.append(Sample(ts, job, STEP_METRIC, r, it, (ms,), node=f"node{r // 2}", cluster="c1"))
            rows.append(Sample(ts, job, "forward-compute", r, it, (ms / 2, ms / 4), subname="mb", node=f"node{r // 2}"))
    return rows


def test_round_trip_keeps_every_field(store):
    rows = step_rows("job-a", range(3), ranks=4)
    store.write(rows)
    back = list(store.samples("job-a", 0, 2))
    key = lambda s: (s.iteration, s.rank, s.metric_name, s.subname)  # noqa: E731
    assert back == sorted(rows, key=key)  # ms timestamps, value tuples, strings: all exact
    assert [s.iteration for s in store.samples("job-a", 1, 1)] == [1] * 8
    assert list(store.samples("job-b", 0, 2)) == []
    assert store.jobs() == ["job-a"]


def test_table_reads_are_the_rows_of_samples_in_their_order(engine):
    from relax_straggler.stores.base import SAMPLE_SCHEMA, samples_to_table, table_to_samples

    s = ClickHouseStore(engine.url(f"test_store_{next(_databases)}"))
    try:
        rows = step_rows("job-a", range(4), ranks=3)
        s.write(rows)
        table = s.table("job-a", 1, 2)
        assert table.schema == SAMPLE_SCHEMA
        assert table.equals(samples_to_table(list(s.samples("job-a", 1, 2))))
        assert list(table_to_samples(table)) == [r for r in sorted(rows, key=lambda r: (r.iteration, r.rank,
                                                 r.metric_name, r.subname)) if 1 <= r.iteration <= 2]
        assert sum(t.num_rows for t in s.tables("job-a", 0, 3)) == len(rows)
        assert s.table("no-such-job", 0, 9).equals(SAMPLE_SCHEMA.empty_table())
    finally:
        s.close()
    missing = ClickHouseStore(engine.url(f"test_store_{next(_databases)}"))
    try:  # no table yet: no rows
        assert missing.table("job-a", 0, 9).num_rows == 0
    finally:
        missing.close()


def test_iterations_aggregate_the_step_metric(store):
    store.write(step_rows("job-a", range(5), ranks=4, slow_rank=2))
    store.write(step_rows("job-b", range(2), ranks=2))
    its = store.iterations("job-a")
    assert [i.iteration for i in its] == [0, 1, 2, 3, 4]
    assert its[3] == IterationTime(3, 300.0, T0 + 3 + 0.003, 4)  # max over ranks; newest row; 4 ranks
    assert [i.iteration for i in store.iterations("job-a", after_iteration=2)] == [3, 4]
    assert store.iterations("job-a", after_iteration=4) == []
    assert store.iterations("no-such-job") == []


def test_since_bounds_every_query_to_the_millisecond(store):
    store.write(step_rows("old", range(3), ranks=2, t0=T0))
    store.write(step_rows("new", range(3), ranks=2, t0=T0 + 86_400 * 3))  # another partition
    since = T0 + 1.001  # iteration 1, rank 1 is exactly at since; rank 0 is 1 ms before
    assert store.jobs(since=since) == ["new", "old"]
    assert store.jobs(since=T0 + 86_400) == ["new"]
    assert [(s.iteration, s.rank) for s in store.samples("old", 0, 9, since=since) if s.metric_name == STEP_METRIC] \
        == [(1, 1), (2, 0), (2, 1)]
    assert [(i.iteration, i.ranks) for i in store.iterations("old", since=since)] == [(1, 1), (2, 2)]


def test_job_ids_cannot_inject_sql(store):
    hostile = ["x' OR 1=1 --", "a\\' OR '1'='1", "b'; DROP TABLE megatron_metrics; --", "tab\there\nnewline",
               "back\\slash\\", "ünïcødé ジョブ"]
    for i, job in enumerate(hostile):
        store.write(step_rows(job, range(i + 1), ranks=1))
    assert store.jobs() == sorted(hostile)
    for i, job in enumerate(hostile):
        assert [it.iteration for it in store.iterations(job)] == list(range(i + 1))
        assert {s.job for s in store.samples(job, 0, 99)} == {job}
    assert store.iterations("' OR ''='") == []


def test_malformed_rows_are_rejected_naming_row_and_field(store):
    good = step_rows("job-a", range(1), ranks=1)
    cases = [
        (Sample(T0, "job-a", STEP_METRIC, 0, 0, (float("nan"),)), "values must be finite numbers"),
        (Sample(T0, "job-a", STEP_METRIC, 0, 0, ()), "values must be a non-empty sequence"),
        (Sample(T0, "job-a", STEP_METRIC, 0, 0, ("12",)), "values must be finite numbers"),
        (Sample(T0, "job-a", STEP_METRIC, -1, 0, (1.0,)), "rank must be an integer"),
        (Sample(T0, "job-a", STEP_METRIC, True, 0, (1.0,)), "rank must be an integer"),
        (Sample(T0, "", STEP_METRIC, 0, 0, (1.0,)), "job must be a non-empty string"),
        (Sample(float("inf"), "job-a", STEP_METRIC, 0, 0, (1.0,)), "timestamp must be a finite time"),
        (Sample(T0, "job-a", STEP_METRIC, 0, 1.5, (1.0,)), "iteration must be an integer"),
    ]
    for bad, message in cases:
        with pytest.raises(ValueError, match=f"row {len(good)} .*{message}"):
            store.write([*good, bad])
    assert store.jobs() == []  # a rejected batch writes nothing


def test_bad_urls_are_rejected():
    with pytest.raises(ValueError, match="database"):
        ClickHouseStore("clickhouse://127.0.0.1:8123/bad-name;")
    with pytest.raises(ValueError, match="clickhouse://"):
        ClickHouseStore("file:///tmp/x")


def test_a_column_dropped_behind_the_store_refuses_the_write_naming_it(store, engine):
    store.write(step_rows("job-a", range(1), ranks=1))
    admin(engine, f"ALTER TABLE {store.database}.megatron_metrics DROP COLUMN cluster")
    # The insert fails on the server (no such column); the store reads the columns again and
    # refuses rows it could not keep whole rather than drop their cluster.
    with pytest.raises(StoreError, match=r"megatron_metrics.* no column for cluster"):
        store.write(step_rows("job-a", range(1, 2), ranks=1))
    assert [i.iteration for i in store.iterations("job-a")] == [0]  # reads go on


def test_server_errors_name_the_store_and_carry_the_code(store):
    with pytest.raises(ClickHouseError, match=rf"{store.url}: code 62: .*") as info:
        store._client.rows("SELEKT 1")  # a syntax error: its code from the answer's header
    assert info.value.code == 62


def test_a_database_dropped_behind_the_store_is_created_again(store, engine):
    store.write(step_rows("job-a", range(2), ranks=1))
    admin(engine, f"DROP DATABASE {store.database}")
    assert store.iterations("job-a") == []  # the rows are gone; reading does not fail
    store.write(step_rows("job-a", range(2, 4), ranks=1))  # a server that lost its data: same object
    assert [i.iteration for i in store.iterations("job-a")] == [2, 3]


def test_a_table_dropped_behind_the_store_is_created_again(store, engine):
    store.write(step_rows("job-a", range(2), ranks=1))
    admin(engine, f"DROP TABLE {store.database}.megatron_metrics")
    assert list(store.samples("job-a", 0, 9)) == [] and store.jobs() == []
    store.write(step_rows("job-a", range(2, 4), ranks=1))
    assert [i.iteration for i in store.iterations("job-a")] == [2, 3]


def test_a_read_only_user_reads_and_is_refused_writes_by_name(store, engine):
    store.write(step_rows("job-a", range(2), ranks=2))
    reader = ClickHouseStore(engine.url(store.database, user="reader"))
    try:
        assert [i.iteration for i in reader.iterations("job-a")] == [0, 1]
        assert len(list(reader.samples("job-a", 0, 1))) == 8
        with pytest.raises(StoreError, match=r"user 'reader' may not write to `test_store_\d+`.`megatron_metrics` "
                                             r"\(server code 164: .*readonly"):
            reader.write(step_rows("job-a", range(2, 3), ranks=1))
    finally:
        reader.close()
    empty = ClickHouseStore(engine.url(f"test_store_{next(_databases)}", user="reader"))
    try:  # nothing to read yet: no rows, and no attempt to create anything
        assert empty.iterations("job-a") == [] and empty.jobs() == []
    finally:
        empty.close()


def test_a_server_killed_mid_use_raises_store_error_then_loses_nothing(tmp_path):
    require_chdb()
    server = ClickHouseServer(tmp_path, free_port())
    server.start()
    s = ClickHouseStore(server.url("restart"), timeout_s=10.0)
    try:
        s.write(step_rows("job-a", range(0, 5), ranks=2))
        server.kill()  # SIGKILL: no shutdown, as a crash or an OOM kill
        pending = step_rows("job-a", range(5, 10), ranks=2)
        with pytest.raises(StoreError, match=rf"{s.url}: NewConnectionError: .*Connection refused"):
            s.write(pending)  # refused before it was sent: never half-written
        with pytest.raises(StoreError):
            s.iterations("job-a")
        with pytest.raises(StoreError):
            s.ping()
        server.start()
        deadline = time.monotonic() + 60
        while True:  # the same object, no new connection set up by the caller
            try:
                s.write(pending)  # what a caller does: retry the failed batch
                break
            except StoreError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert [i.iteration for i in s.iterations("job-a")] == list(range(10))
        assert len(list(s.samples("job-a", 0, 9))) == 10 * 2 * 2
        server.stop()  # SIGTERM: an orderly restart
        server.start()
        assert len(list(s.samples("job-a", 0, 9))) == 10 * 2 * 2
    finally:
        s.close()
        server.stop()

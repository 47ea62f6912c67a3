"""ClickHouseStore against a real clickhouse-server on 127.0.0.1 (tests/services/clickhouse.sh)."""

from __future__ import annotations

import itertools
import time

import httpx
import pytest

from conftest import ClickHouseServer, free_port, require_clickhouse
from relax_straggler.stores.clickhouse import ClickHouseStore
from relax_straggler.stores.base import STEP_METRIC, IterationTime, Sample, StoreError

_databases = itertools.count()
T0 = 1_790_000_000.0  # a fixed time, s since the epoch


@pytest.fixture
def store(clickhouse_server):
    """A store on a database of its own (created by the store on first use)."""
    s = ClickHouseStore(clickhouse_server.url(f"test_store_{next(_databases)}"))
    yield s
    s.close()


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


def test_server_errors_name_the_store(store, clickhouse_server):
    store.write(step_rows("job-a", range(1), ranks=1))
    # Make the next insert fail server-side: a column it names is gone.
    response = httpx.post(f"http://127.0.0.1:{clickhouse_server.port}/",
                          content=f"ALTER TABLE {store.database}.megatron_metrics DROP COLUMN cluster")
    assert response.status_code == 200, response.text
    with pytest.raises(StoreError, match=rf"{store.url}: code \d+: .*cluster"):
        store.write(step_rows("job-a", range(1, 2), ranks=1))


def test_a_table_dropped_behind_the_store_is_created_again(store, clickhouse_server):
    store.write(step_rows("job-a", range(2), ranks=1))
    response = httpx.post(f"http://127.0.0.1:{clickhouse_server.port}/",
                          content=f"DROP DATABASE {store.database}")
    assert response.status_code == 200, response.text
    store.write(step_rows("job-a", range(2, 4), ranks=1))  # a server that lost its data: same object
    assert [i.iteration for i in store.iterations("job-a")] == [2, 3]


def test_restart_mid_use_raises_store_error_then_recovers(tmp_path):
    require_clickhouse()
    server = ClickHouseServer(tmp_path / "ch", free_port())
    server.start()
    s = ClickHouseStore(server.url("restart"), timeout_s=10.0)
    try:
        s.write(step_rows("job-a", range(0, 5), ranks=2))
        server.stop()
        pending = step_rows("job-a", range(5, 10), ranks=2)
        with pytest.raises(StoreError, match=s.url):
            s.write(pending)
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
    finally:
        s.close()
        server.stop()
